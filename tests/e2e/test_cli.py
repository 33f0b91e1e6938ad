"""The manta CLI from a clean virtualenv against a running Manta (gunicorn, a real worker, real
Ray): log in, submit a working directory and follow it to the end; a failing script; Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from audit.context import Actor
from jobs.models import Job, JobAttempt
from tests.conftest import PASSWORD, build_world, sigint_as_in_a_terminal
from tests.e2e.conftest import ROOT
from tests.e2e.servers import Api
from workspaces import services as ws_services

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

TRAIN = """\
import time

import helper

for step in range(6):
    print(helper.line(step), flush=True)
    time.sleep(0.5)
"""
HELPER = "def line(step):\n    return f'step {step} done'\n"


@pytest.fixture(scope="module")
def manta_bin(tmp_path_factory) -> Path:
    """`pip install ./cli` into a virtualenv of its own."""
    venv = tmp_path_factory.mktemp("cli-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
         str(ROOT / "cli")],
        check=True, timeout=600,
    )  # fmt: skip
    return venv / "bin" / "manta"


@pytest.fixture
def cli(e2e, manta_bin, tmp_path):
    world = build_world()
    # The API process checks passwords with the service's hashers, not the tests' fast one.
    developer = world.users["developer"]
    developer.password = PBKDF2PasswordHasher().encode(PASSWORD, "clitestsalt", iterations=1000)
    developer.save(update_fields=["password"])
    ws_services.workspace_update(
        actor=Actor.for_user(world.users["ws_admin"]),
        workspace=world.ws,
        data={"adhoc_jobs": True},
    )
    api = Api(e2e.env, tmp_path / "api.log")
    api.start()
    try:
        yield from _logged_in(api, manta_bin, tmp_path)
    finally:
        api.stop()


def _logged_in(api: Api, manta_bin: Path, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}

    def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(manta_bin), *args], env=env, capture_output=True, text=True, timeout=300,
            **kwargs,
        )  # fmt: skip

    login = run("login", "--url", api.base, "--email", "dev@acme.test", input=f"{PASSWORD}\n")
    assert login.returncode == 0, login.stderr
    context = run("context", "--org", "acme", "--workspace", "ml")
    assert context.returncode == 0, context.stderr
    yield run, env, tmp_path


def code_dir(root: Path, train: str) -> Path:
    code = root / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(train)
    (code / "helper.py").write_text(HELPER)
    (code / ".gitignore").write_text("data/\n")
    (code / "data").mkdir(exist_ok=True)
    (code / "data" / "big.bin").write_bytes(os.urandom(1024))
    return code


def submit_args(code: Path) -> list[str]:
    return ["submit", "--working-dir", str(code), "--image", "rayproject/ray:2.60.0",
            "--workers", "0", "--follow", "--", "python", "train.py"]  # fmt: skip


def test_submit_a_working_dir_and_follow_it_to_the_end(cli, manta_bin, ray_work_dir):
    run, env, tmp_path = cli
    code = code_dir(tmp_path, TRAIN)
    proc = subprocess.Popen(
        [str(manta_bin), *submit_args(code)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen, states = [], []
    for line in proc.stdout:
        seen.append(line.rstrip("\n"))
        if line.startswith("step "):
            states.append(Job.objects.order_by("-pk").values_list("state", flat=True).first())
    assert proc.wait(timeout=60) == 0, "\n".join(seen)
    steps = [line for line in seen if line.startswith("step ")]
    assert steps == [f"step {n} done" for n in range(6)], "\n".join(seen)
    assert "running" in states  # the output appeared while the job ran
    job = Job.objects.order_by("-pk").first()
    assert job.state == "succeeded" and job.template_version is None
    assert job.spec["runtime_env"]["working_dir"].startswith("manta://packages/")
    # The same directory again: not uploaded twice.
    again = run(*submit_args(code))
    assert again.returncode == 0 and "already" in (again.stdout + again.stderr).lower()


def test_a_failing_script_exits_1_with_its_traceback(cli, ray_work_dir):
    run, _, tmp_path = cli
    code = code_dir(tmp_path, "import helper\nraise SystemExit(helper.nothing())\n")
    failed = run(*submit_args(code))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    output = failed.stdout + failed.stderr
    assert "Traceback" in output and "AttributeError" in output
    assert Job.objects.order_by("-pk").first().state == "failed"


def test_ctrl_c_offers_to_cancel_the_job(cli, manta_bin, ray_work_dir):
    _, env, tmp_path = cli
    code = code_dir(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    proc = subprocess.Popen(
        [str(manta_bin), *submit_args(code)], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if "started" in line:
            break
        assert time.monotonic() < deadline
    proc.send_signal(signal.SIGINT)
    proc.stdin.write("y\n")
    proc.stdin.flush()
    assert proc.wait(timeout=60) == 130
    job = Job.objects.order_by("-pk").first()
    assert job.state == "cancelled"
    deadline = time.monotonic() + 60
    while JobAttempt.objects.filter(job=job, torn_down_at__isnull=True).exists():
        assert time.monotonic() < deadline, "the cluster of the cancelled job was not torn down"
        time.sleep(0.5)
