"""Shared set-up for the benchmarks: a PostgreSQL database of their own, Redis, a real Celery
worker, and Django configured in this process. Everything binds to 127.0.0.1."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/13")


def configure(db_name: str, **extra_env: str) -> dict[str, str]:
    """Point this process (and the workers it starts) at a fresh benchmark database."""
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db_name}"')
    var = tempfile.mkdtemp(prefix="manta-bench-")
    env = {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"{PG}/{db_name}",
        "CELERY_BROKER_URL": BROKER,
        "MANTA_VAR_DIR": var,
        "MANTA_LOCAL_RAY_DIR": tempfile.mkdtemp(prefix="mb-", dir="/tmp"),
        "SECRET_KEY": "bench",
        "LOG_LEVEL": "WARNING",
        **extra_env,
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import redis

    redis.Redis.from_url(BROKER).flushdb()
    return env


class CeleryWorker:
    def __init__(
        self,
        env: dict[str, str],
        concurrency: int = 2,
        beat: bool = False,
        queues: str | None = None,
        name: str | None = None,
    ):
        """One worker process; ``queues`` (comma-separated) limits what it consumes (default:
        every queue the settings declare)."""
        tag = name.partition("@")[0] if name else "worker"
        self.log = Path(env["MANTA_VAR_DIR"]) / f"{tag}.log"
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "-l",
            "info",
            "--concurrency",
            str(concurrency),
        ]
        if queues:
            args += ["-Q", queues]
        if name:
            args += ["-n", name]
        if beat:
            args += ["-B", "-s", str(Path(env["MANTA_VAR_DIR"]) / "beat")]
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=open(self.log, "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while "ready." not in self.log.read_text(errors="replace"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(self.log.read_text()[-3000:])
            time.sleep(0.1)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


class CeleryWorkers:
    """The deployment's pair, as ``make worker`` starts it: one worker for the job lifecycle
    (the default queue) and one for webhook delivery, so a slow receiver's backlog never holds
    a launch (docs/architecture.md, "Dispatch")."""

    def __init__(self, env: dict[str, str], concurrency: int = 2, beat: bool = False):
        self.jobs = CeleryWorker(
            env, concurrency, beat=beat, queues="celery", name=f"jobs-{os.getpid()}@%h"
        )
        try:
            self.webhooks = CeleryWorker(
                env, concurrency, queues="webhooks", name=f"webhooks-{os.getpid()}@%h"
            )
        except BaseException:
            self.jobs.stop()
            raise

    def stop(self) -> None:
        self.webhooks.stop()
        self.jobs.stop()


def stop_clusters(ray_dir: str) -> None:
    """Stop every local cluster a benchmark left under its Ray dir (one cut short, say)."""
    from jobs.launchers.local import LocalRayLauncher, discover_handles

    launcher = LocalRayLauncher()
    for handle in discover_handles(ray_dir):
        launcher.stop(handle)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values)


def bench_workspace(spec: dict, *, target: dict | None = None) -> dict:
    """An org with an owner and a developer, a workspace whose jobs need approval (so the clock
    starts at the approval), optionally on a compute target, and a template of ``spec``."""
    from audit.context import Actor
    from jobs import services as job_services
    from workspaces import compute_targets, services

    system = Actor.system("bench")
    org, owner = services.org_create(actor=system, slug="bench", name="", owner_email="o@b.test")
    dev = services.user_create_in_org(
        actor=system, organization=org, email="d@b.test", password="a-long-password"
    ).user
    ws = services.workspace_create(actor=system, organization=org, slug="w")
    services.member_add(actor=system, workspace=ws, email=dev.email, role="developer")
    data = {"approval_policy": "always"}
    if target:
        compute_targets.compute_target_create(actor=system, organization=org, **target)
        data["compute_target"] = target["name"]
    ws = services.workspace_update(actor=system, workspace=ws, data=data)
    template = job_services.template_create(
        actor=Actor.for_user(owner), workspace=ws, name="b", spec=spec
    ).template
    return {"dev": Actor.for_user(dev), "admin": Actor.for_user(owner), "ws": ws,
            "template": template}  # fmt: skip
