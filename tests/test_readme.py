"""The README is a manual whose examples run as written.

Every ```bash block of README.md is one step of the manual path, in order: the bootstrap
(``manage.py create_org``, its token kept by the shell), then requests with curl, each followed by
a line ``# → 201 …`` naming the status it answers with. The end-to-end test clones the checkout,
starts ``make serve`` and ``make worker`` there with no environment (the embedded SQLite
database and filesystem broker under the clone's var/, as the README says), runs the blocks in
one bash, and checks each request's status in order; the README's job really runs on the worker,
to ``succeeded``. The one substitution is the one the README tells its reader to make: the port
``make serve`` listens on."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
STATUS = re.compile(r"^# → (\d{3})\b")
DEFAULT_ADDRESS = "http://127.0.0.1:8000"
# The curl the blocks run is this wrapper: the real curl, also writing the status to stderr.
MARK = "manta-readme-status"
# Docs other parts of the project own; linked from the README before they land.
ELSEWHERE = {"docs/observability.md", "docs/dashboard.md", "docs/console.md"}


def bash_blocks(text: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == "bash"]


def documented_statuses(blocks: list[str]) -> list[int]:
    """The status under each request, in order; fails if a request has none or two."""
    statuses, pending = [], False
    for block in blocks:
        assert not pending
        for line in block.splitlines():
            if match := STATUS.match(line):
                assert pending, f"a status with no request before it: {line!r}"
                statuses.append(int(match[1]))
                pending = False
            elif not line.startswith("#") and re.search(r"\bcurl\b", line):
                assert not pending, f"a request with no documented status before: {line!r}"
                pending = True
    assert not pending, "the last request has no documented status"
    return statuses


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_request_documents_its_status():
    blocks = bash_blocks(README.read_text())
    statuses = documented_statuses(blocks)
    assert len(statuses) >= 20
    requests_written = sum(
        len(re.findall(r"\bcurl\b", line))
        for block in blocks
        for line in block.splitlines()
        if not line.startswith("#")
    )
    assert requests_written == len(statuses)
    # The blocks use the path the README bootstraps: one organisation, one base address.
    script = "\n".join(blocks)
    assert re.findall(r"orgs/([\w-]+)/", script) and set(re.findall(r"orgs/([\w-]+)/", script)) == {
        "acme"
    }
    assert script.count(DEFAULT_ADDRESS) == 1, "the address is set once, in $API"


def test_the_contents_and_links_resolve():
    text = README.read_text()
    outside = FENCE.sub("", text)
    anchors = {slug(h) for h in re.findall(r"^#{2,4} (.+)$", outside, re.M)}
    links = re.findall(r"\]\(([^)\s]+)\)", outside)
    assert links
    for link in links:
        if link.startswith("#"):
            assert link[1:] in anchors, link
        elif not link.startswith("http") and link not in ELSEWHERE:
            assert (ROOT / link.split("#")[0]).exists(), link
    for doc in ("docs/architecture.md", "docs/security.md", "docs/benchmarks.md"):
        assert f"]({doc})" in outside, doc


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


def curl_wrapper(directory: Path) -> Path:
    directory.mkdir()
    wrapper = directory / "curl"
    write_out = f"%{{stderr}}\\n{MARK} %{{http_code}}\\n"
    wrapper.write_text(f"#!/bin/sh\nexec {shutil.which('curl')} -w '{write_out}' \"$@\"\n")
    wrapper.chmod(0o755)
    return directory


@pytest.mark.e2e
@pytest.mark.ray
def test_the_readme_runs_as_written_against_make_serve_and_make_worker(tmp_path):
    """The manual path in a clean clone with no environment: `make serve` and `make worker`,
    then every ```bash block of the README in order, each request answering its documented
    status; the README's job succeeds on the worker's Ray cluster."""
    blocks = bash_blocks(README.read_text())
    expected = documented_statuses(blocks)
    clone = tmp_path / "manta"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    # The checked-out README is the one under test (uncommitted edits included).
    shutil.copy(README, clone / "README.md")
    # The installed virtualenv, as `make install` would build it from the same lock file: its
    # stamp names what it holds, so make in the clone installs nothing into it.
    (clone / ".venv").symlink_to(ROOT / ".venv")
    stamp = subprocess.run(
        ["make", "-n", "install"], cwd=clone, capture_output=True, text=True, check=True
    )
    assert "pip install" not in stamp.stdout, "the clone would reinstall the shared .venv"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    # Where a test run was given a Ray dir of its own (engineers sharing a machine), the worker
    # keeps to it: the sweep stops clusters under that dir that are not its own.
    if "MANTA_LOCAL_RAY_DIR" in os.environ:
        env["MANTA_LOCAL_RAY_DIR"] = os.environ["MANTA_LOCAL_RAY_DIR"]
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
        state = tmp_path / "state"
        script = "\n".join(
            [
                "set -euo pipefail",
                *[block.replace(DEFAULT_ADDRESS, base) for block in blocks],
                # The test's own epilogue: what the steps left, to check the job below.
                f'printf "%s\\n" "$DEV" "$JOB" > {state}',
            ]
        )
        shell_env = {**env, "PATH": f"{curl_wrapper(tmp_path / 'bin')}:{env['PATH']}"}
        run = subprocess.run(
            ["bash", "-c", script], cwd=clone, env=shell_env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        answered = [int(code) for code in re.findall(rf"^{MARK} (\d+)$", run.stderr, re.M)]
        transcript = f"{run.stdout[-4000:]}\n--- stderr\n{run.stderr[-4000:]}"
        assert run.returncode == 0, transcript
        assert answered == expected, transcript
        dev, job = state.read_text().split()
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {dev}"
        job_url = f"{base}/api/v1/orgs/acme/workspaces/ml/jobs/{job}/"
        assert api.get(job_url, timeout=30).json()["state"] == "succeeded"
        assert api.get(f"{job_url}logs/", timeout=30).json()["logs"].strip().endswith("10")
    # The embedded stores live in the clone's var/, nowhere else.
    assert (clone / "var" / "manta.sqlite3").exists()


def test_a_request_without_one_documented_status_is_refused():
    with pytest.raises(AssertionError):
        documented_statuses(['curl -s "$API/me/"\n'])
    with pytest.raises(AssertionError):
        documented_statuses(['curl -s "$API/me/"\ncurl -s "$API/orgs/"\n# → 200\n'])
    with pytest.raises(AssertionError):
        documented_statuses(["# → 200\n"])
    assert documented_statuses(['curl -s "$API/me/" \\\n  -H "A: b"\n# → 200 {…}\n']) == [200]
