"""The README's manual path: in a clean clone with no environment set, `make serve` and
`make worker` (the embedded SQLite database and filesystem broker under var/) run a job
submitted over HTTP to `succeeded`."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = "python -c \"import ray; ray.init(); print('sum', sum(ray.get([ray.remote(lambda i: i).remote(i) for i in range(5)])))\""  # noqa: E501


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def started(args: list[str], cwd: Path, env: dict[str, str], log: Path):
    with open(log, "w") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_make_serve_and_make_worker_run_a_job_with_no_environment(tmp_path):
    clone = tmp_path / "manta"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    # The installed virtualenv, as `make install` would build it from the same lock file: its
    # stamp names what it holds, so make in the clone installs nothing into it.
    (clone / ".venv").symlink_to(ROOT / ".venv")
    stamp = subprocess.run(
        ["make", "-n", "install"], cwd=clone, capture_output=True, text=True, check=True
    )
    assert "pip install" not in stamp.stdout, "the clone would reinstall the shared .venv"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with (
        started(["make", "serve", f"PORT={port}"], clone, env, tmp_path / "serve.log") as serve,
        started(["make", "worker"], clone, env, tmp_path / "worker.log") as worker,
    ):
        deadline = time.monotonic() + 120
        while True:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{base}/readyz", timeout=2).ok:
                    break
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        created = subprocess.run(
            [".venv/bin/python", "manage.py", "create_org", "acme", "--owner", "o@acme.test"],
            cwd=clone, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        token = created.stdout.strip().splitlines()[-1]
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {token}"
        ws = f"{base}/api/v1/orgs/acme/workspaces/"
        response = api.post(ws, json={"slug": "ml", "name": "ML"}, timeout=30)
        assert response.status_code == 201, response.text
        template = {
            "name": "sum",
            "image": "rayproject/ray:2.60.0",
            "entrypoint": ENTRYPOINT,
            "head": {"cpu": 1, "memory_gb": 1},
            "worker_groups": [],
            "max_runtime_seconds": 120,
        }
        response = api.post(f"{ws}ml/templates/", json=template, timeout=30)
        assert response.status_code == 201, response.text
        response = api.post(f"{ws}ml/jobs/", json={"template": response.json()["id"]}, timeout=30)
        assert response.status_code == 201, response.text
        job_url = f"{ws}ml/jobs/{response.json()['id']}/"
        deadline = time.monotonic() + 180
        while (job := api.get(job_url, timeout=30).json())["state"] not in (
            "succeeded", "failed", "cancelled", "rejected",
        ):  # fmt: skip
            assert time.monotonic() < deadline, job
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(1)
        assert job["state"] == "succeeded", (job, (tmp_path / "worker.log").read_text()[-3000:])
        assert "sum 10" in api.get(f"{job_url}logs/", timeout=30).json()["logs"]
    # The embedded stores live in the clone's var/, nowhere else.
    assert (clone / "var" / "manta.sqlite3").exists() or list((clone / "var").glob("*.sqlite3"))
