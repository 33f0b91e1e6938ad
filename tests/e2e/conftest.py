"""End-to-end fixtures: a real Celery worker (with its beat) against Redis and the test
PostgreSQL database, launching real local Ray clusters."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from jobs.launchers.local import LocalRayLauncher, discover_handles

ROOT = Path(__file__).resolve().parents[2]


def cluster_processes(work_dir: str, *, named: bytes = b"") -> list[int]:
    """Pids of processes whose command line mentions ``work_dir`` (every Ray process started
    for a cluster there carries its temp dir on its command line), and ``named`` too."""
    pids = []
    marker = work_dir.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and named in cmdline:
            pids.append(int(entry.name))
    return pids


class Worker:
    """The deployment's workers, as ``make worker`` starts them: one for the job lifecycle's
    queue (with the beat) and one for the ``webhooks`` queue, each in a session of its own,
    logging to one file. Each serves its own metrics: the webhooks worker on the
    ``MANTA_WORKER_METRICS_PORT`` of ``webhooks_env``, or none."""

    def __init__(self, env: dict[str, str], log_path: Path, webhooks_env: dict[str, str]):
        self.env, self.log_path, self.proc, self.webhooks = env, log_path, None, None
        self.webhooks_env = {
            **{k: v for k, v in env.items() if k != "MANTA_WORKER_METRICS_PORT"},
            **webhooks_env,
        }

    def start(self) -> None:
        log = open(self.log_path, "a")  # noqa: SIM115  (kept for the process's lifetime)
        tag, self.webhooks = time.monotonic_ns(), None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "-l", "info",
             "-Q", "celery", "--concurrency", "4", "-n", f"e2e-{tag}@%h",
             "-s", str(Path(self.env["MANTA_VAR_DIR"]) / "beat-schedule")],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            self.webhooks = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "info",
                 "-Q", "webhooks", "--concurrency", "2", "-n", f"e2e-webhooks-{tag}@%h"],
                cwd=ROOT, env=self.webhooks_env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            self._wait_ready()
        except BaseException:
            self.stop()  # neither is left behind, to take the next test's tasks
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.log_path.read_text(errors="replace").count(" ready.") >= 2:
                return
            if self.proc.poll() is not None or self.webhooks.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"celery worker did not start:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole worker (main process, pool, beat), as if its host process died."""
        for proc in (self.proc, self.webhooks):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # forget the "ready." of the dead worker
        self.log_path.write_text("")

    def stop(self) -> None:
        running = [proc for proc in (self.proc, self.webhooks) if proc and proc.poll() is None]
        for proc in running:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def ray_work_dir():
    path = tempfile.mkdtemp(prefix="mray-", dir="/tmp")
    yield path
    leftovers = {pid: _cmdline(pid) for pid in cluster_processes(path)}
    dirs = {p.name: sorted(c.name for c in p.iterdir()) for p in Path(path).iterdir() if p.is_dir()}
    if leftovers:  # stopped whole (sandbox, cgroups, disk): they would hold the next module's CPUs
        for handle in discover_handles(path):
            LocalRayLauncher().stop(handle)
        for pid in cluster_processes(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)
    assert not leftovers, f"Ray processes left running after the tests: {leftovers}; {dirs}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160].decode()
    except OSError:
        return "(gone)"


def start_worker(
    tmp_path_factory,
    name: str,
    *,
    broker: str | None = None,
    webhooks_env: dict[str, str] | None = None,
    **extra_env: str,
) -> Worker:
    """A real worker (with beat) on the test database and the broker this process sends to (or
    ``broker``), its Redis database emptied first; ``extra_env`` sets its Manta settings (and
    ``webhooks_env`` more, for the webhooks worker alone)."""
    var = tmp_path_factory.mktemp(name)
    broker = broker or settings.CELERY_BROKER_URL
    redis.Redis.from_url(broker).flushdb()
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": broker,
        # the same key on both sides: it encrypts launcher handles and webhook secrets
        "SECRET_KEY": settings.SECRET_KEY,
        "MANTA_VAR_DIR": str(var),
        # the code packages this process's API stores, where the worker reads them
        "MANTA_PACKAGE_STORAGE_OPTIONS": json.dumps(settings.STORAGES["packages"]["OPTIONS"]),
        "PYTHONUNBUFFERED": "1",
        # A sandboxed node reserves what its cgroups allow (a 0-CPU head one CPU, a disk of
        # MANTA_DEFAULT_NODE_DISK_GB), so on a 2-core machine this host would hold one test
        # cluster at a time. The host's capacity is not what these tests are about
        # (tests/quotas/test_host_capacity.py and tests/e2e/test_crash.py set it where it is).
        "MANTA_LOCAL_CAPACITY": "cpu=64,memory_gb=256,disk_gb=4096",
        **extra_env,
    }
    proc = Worker(env, var / "worker.log", webhooks_env or {})
    proc.start()
    return proc


# Short intervals, so lost work is found again within seconds (bench/chaos.py uses them too).
FAST_RECOVERY = {
    "MANTA_SWEEP_INTERVAL_SECONDS": "2",
    "MANTA_HEARTBEAT_STALE_SECONDS": "6",
    "MANTA_LEASE_SECONDS": "6",
    "MANTA_FOLLOW_INTERVAL_SECONDS": "0.5",
    "MANTA_CLUSTER_LOST_SECONDS": "6",
    "MANTA_LOG_SAVE_SECONDS": "1",
}


def start_launch_worker(
    tmp_path_factory,
    ray_work_dir: str,
    webhooks_env: dict[str, str] | None = None,
    **extra_env: str,
) -> Worker:
    """A worker that launches local clusters under ``ray_work_dir``, with short intervals so
    lost work is found again within seconds."""
    return start_worker(
        tmp_path_factory,
        "worker-var",
        webhooks_env=webhooks_env,
        MANTA_LOCAL_RAY_DIR=ray_work_dir,
        **{**FAST_RECOVERY, **extra_env},
    )


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, ray_work_dir, tmp_path_factory):
    proc = start_launch_worker(tmp_path_factory, ray_work_dir)
    yield proc
    proc.stop()


@pytest.fixture
def e2e(worker, transactional_db):
    """A committed database the worker can see (tasks go to the worker's broker)."""
    yield worker
    connection.close()
