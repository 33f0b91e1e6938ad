"""Jobs under faults: N real jobs on the local target while a schedule of faults hits the
execution layer, then what was left wrong.

Set-up: a PostgreSQL database of its own, a Redis of its own (so it can be stopped), one
Celery worker with beat (short intervals, as an operator running tight would set them), a
webhook receiver subscribed to every event, and the local target with room for two clusters of
a 1-CPU worker at a time (4 CPUs: a sandboxed 0-CPU head holds 1). Each job runs 12 one-second
Ray tasks on its worker node.

Faults, in order, each once the previous one has recovered:

* ``worker_kill``: SIGKILL the worker and its beat, start a new one. Recovered when every
  attempt that was active has a heartbeat from the new worker.
* ``head_kill``: SIGKILL every process of a running job's head node. Recovered when the job
  runs again on a fresh cluster (``cluster_lost``, then a retry).
* ``node_kill``: SIGKILL every Ray process of a running job's worker node. Recovered when the
  node is back (``job.node_restarted``).
* ``db_terminate``: terminate every PostgreSQL backend of the database. Recovered when a
  follower records a heartbeat again.
* ``broker_outage``: stop Redis for 10 s while two jobs are submitted, start it again.
  Recovered (counted from the restart) when both are admitted.

    .venv/bin/python bench/chaos.py [--jobs 6]

Prints jobs stuck non-terminal (goal 0), duplicate Ray submissions (0: an attempt's entrypoint
started more than once), leaked processes (0), lost webhook deliveries (0) and each fault's
time to recover.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from common import CeleryWorker, bench_workspace, configure, stop_clusters
from webhooks import ReceiverProcess

from tests.e2e.conftest import FAST_RECOVERY, cluster_processes

TASKS = (
    "python -c \"import ray, time; ray.init(); print('run started', flush=True); "
    "f = ray.remote(num_cpus=1)(lambda i: (time.sleep(1), i)[1]); "
    "print('sum', sum(ray.get([f.remote(i) for i in range(12)])))\""
)
SPEC = {
    "image": "rayproject/ray:2.60.0",
    "entrypoint": TASKS,
    "head": {"cpu": 0, "memory_gb": 1},
    "worker_groups": [{"name": "w", "replicas": 1, "cpu": 1, "memory_gb": 1}],
    "max_runtime_seconds": 600,
    "max_retries": 2,
}
TERMINAL = ("succeeded", "failed", "cancelled", "rejected")


class Redis:
    """A redis-server of the benchmark's own on a free loopback port."""

    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_until(predicate, timeout: float, what: str) -> float:
    """Seconds until ``predicate()`` held."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=6)
    args = parser.parse_args()
    redis_server = Redis()
    redis_server.start()
    env = configure(
        "manta_bench_chaos",
        CELERY_BROKER_URL=redis_server.url,
        **FAST_RECOVERY,
        MANTA_LOCAL_CAPACITY="cpu=4,memory_gb=64",
        WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
        WEBHOOK_ALLOW_HTTP="true",
        LOG_LEVEL="INFO",
    )
    from django.db import connection
    from django.utils import timezone

    from config import secrets
    from jobs import services as job_services
    from jobs.models import ATTEMPT_ACTIVE, Job, JobAttempt, JobEvent
    from notifications import services as hooks
    from outbox.models import DomainEvent
    from workspaces import services as ws_services

    world = bench_workspace(SPEC)
    ws = ws_services.workspace_update(
        actor=world["admin"], workspace=world["ws"], data={"approval_policy": "auto"}
    )
    tmp = Path(tempfile.mkdtemp(prefix="manta-bench-chaos-"))
    receiver = ReceiverProcess(tmp / "secret", tmp / "received.jsonl")
    endpoint, secret = hooks.webhook_create(
        actor=world["admin"], organization=ws.organization, workspace=None, url=receiver.url,
        event_types=["*"],
    )  # fmt: skip
    (tmp / "secret").write_text(secret)
    ray_dir = env["MANTA_LOCAL_RAY_DIR"]

    def submit() -> int:
        job = job_services.job_submit(actor=world["dev"], workspace=ws, template=world["template"])
        return job.pk

    def running_attempt() -> JobAttempt:
        wait_until(
            lambda: JobAttempt.objects.filter(state="running", submitted=True).exists(),
            300, "a running job",
        )  # fmt: skip
        attempt = JobAttempt.objects.filter(state="running").order_by("running_at").first()
        wait_until(lambda: "run started" in attempt_log(attempt), 120, "the job's first line")
        return attempt

    def attempt_log(attempt: JobAttempt) -> str:
        attempt.refresh_from_db()
        return attempt.log_archive

    def kill(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    worker = CeleryWorker(env, concurrency=4, beat=True)
    recovery: dict[str, float] = {}
    started = time.monotonic()
    try:
        jobs = [submit() for _ in range(args.jobs)]

        # worker_kill
        running_attempt()
        active = list(
            JobAttempt.objects.filter(state__in=ATTEMPT_ACTIVE).values_list("pk", flat=True)
        )
        fault = time.monotonic()
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
        worker = CeleryWorker(env, concurrency=4, beat=True)
        restarted = timezone.now()
        recovery["worker_kill"] = (time.monotonic() - fault) + wait_until(
            lambda: not JobAttempt.objects.filter(pk__in=active, state__in=ATTEMPT_ACTIVE)
            .exclude(heartbeat_at__gt=restarted).exists(),
            120, "followers on the new worker",
        )  # fmt: skip

        # head_kill
        attempt = running_attempt()
        head = secrets.decrypt_json(attempt.handle_encrypted)["nodes"][0]
        fault = time.monotonic()
        kill(cluster_processes(head["temp_dir"]))
        recovery["head_kill"] = wait_until(
            lambda: JobAttempt.objects.filter(
                job_id=attempt.job_id, number__gt=attempt.number, state="running"
            ).exists() or Job.objects.get(pk=attempt.job_id).state in TERMINAL,
            180, "the job on a fresh cluster",
        )  # fmt: skip

        # node_kill
        attempt = running_attempt()
        node = secrets.decrypt_json(attempt.handle_encrypted)["nodes"][1]
        kill([pid for pid in cluster_processes(node["temp_dir"]) if pid != node["pid"]])
        recovery["node_kill"] = wait_until(
            lambda: JobEvent.objects.filter(job_id=attempt.job_id, kind="node_restarted").exists(),
            120, "the node back",
        )  # fmt: skip

        # db_terminate
        running_attempt()
        fault_at = timezone.now()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        recovery["db_terminate"] = wait_until(
            lambda: JobAttempt.objects.filter(heartbeat_at__gt=fault_at).exists(),
            120, "a heartbeat after the termination",
        )  # fmt: skip

        # broker_outage
        redis_server.stop()
        late = [submit(), submit()]
        time.sleep(10)
        redis_server.start()
        recovery["broker_outage"] = wait_until(
            lambda: not Job.objects.filter(pk__in=late, state="queued").exists(),
            180, "the jobs submitted while the broker was away to be admitted",
        )  # fmt: skip
        jobs += late

        # the end: everything settles
        with contextlib.suppress(SystemExit):
            wait_until(
                lambda: not Job.objects.filter(pk__in=jobs).exclude(state__in=TERMINAL).exists(),
                600, "every job to end",
            )  # fmt: skip
        stuck = Job.objects.filter(pk__in=jobs).exclude(state__in=TERMINAL).count()
        failed = Job.objects.filter(pk__in=jobs).exclude(state="succeeded").count()
        duplicates = 0
        for log in JobAttempt.objects.filter(job_id__in=jobs).values_list("log_archive", flat=True):
            duplicates += max(0, log.splitlines().count("run started") - 1)
        with contextlib.suppress(SystemExit):
            wait_until(lambda: not cluster_processes(ray_dir), 60, "clusters to go")
        leaked = len(cluster_processes(ray_dir))
        # every event since the endpoint exists (those of the set-up came before it)
        since = DomainEvent.objects.filter(occurred_at__gte=endpoint.created_at)
        expected = {f"msg_{pk.hex}" for pk in since.values_list("pk", flat=True)}
        with contextlib.suppress(SystemExit):
            wait_until(lambda: expected <= receiver.poll().keys(), 120, "webhook deliveries")
        lost = len(expected - receiver.poll().keys())
    finally:
        worker.stop()
        stop_clusters(ray_dir)
        receiver.stop()
        redis_server.stop()
    total = time.monotonic() - started
    print(f"{len(jobs)} jobs under 5 faults in {total:.0f} s "
          f"({dt.timedelta(seconds=round(total))})")  # fmt: skip
    print(f"  jobs stuck non-terminal: {stuck} (goal 0); not succeeded: {failed}")
    print(f"  duplicate Ray submissions: {duplicates} (goal 0)")
    print(f"  leaked processes: {leaked} (goal 0)")
    print(f"  lost webhook deliveries: {lost} of {len(expected)} (goal 0)")
    for name, seconds in recovery.items():
        print(f"  recovered from {name:<14} in {seconds:5.1f} s")


if __name__ == "__main__":
    main()
