"""Celery dispatch latency: from a job's approval to its launch task starting on a worker.

The path is: approval commits → ``admit`` task → admission transaction creates the attempt →
``launch_attempt`` task starts. The jobs target a ``ray`` compute target with nothing listening,
so each launch fails at once and no cluster is started: only the dispatch is measured. Baseline,
in the same run and against the same worker: a no-op task (``manta.probe``) from ``.delay()`` to
its start.

    .venv/bin/python bench/dispatch.py [--jobs 50]

Prints p50/p99 of both and their ratio (goal: dispatch p50 under 25 ms with Redis).
"""

from __future__ import annotations

import argparse
import time
import uuid

from common import BROKER, CeleryWorker, bench_workspace, configure, percentile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    env = configure("manta_bench_dispatch")
    import redis

    from config.celery import probe
    from jobs import services as job_services
    from jobs.models import Job, JobAttempt, JobEvent

    setup = bench_workspace(
        {"image": "rayproject/ray:2.60.0", "entrypoint": "python -V"},
        target={"name": "nowhere", "kind": "ray", "config": {"address": "http://127.0.0.1:9"}},
    )
    worker = CeleryWorker(env, concurrency=2)
    store = redis.Redis.from_url(BROKER)
    noop, dispatch, admit_hop, launch_hop = [], [], [], []
    try:
        for _ in range(5):  # warm up both paths
            probe.delay(f"warm-{uuid.uuid4()}")
        time.sleep(1)
        for _ in range(args.jobs):
            key = f"probe-{uuid.uuid4()}"
            sent = time.time()
            probe.delay(key)
            while (value := store.get(key)) is None:
                time.sleep(0.001)
            noop.append(float(value) - sent)

            job = job_services.job_submit(
                actor=setup["dev"], workspace=setup["ws"], template=setup["template"]
            )
            job_services.job_approve(actor=setup["admin"], job=job)
            approved = JobEvent.objects.get(job=job, kind="approved").created_at
            while True:
                row = (
                    JobAttempt.objects.filter(job=job)
                    .values_list("created_at", "launch_started_at")
                    .first()
                )
                if row and row[1]:
                    break
                time.sleep(0.002)
            created, started = row
            dispatch.append((started - approved).total_seconds())
            admit_hop.append((created - approved).total_seconds())
            launch_hop.append((started - created).total_seconds())
            while Job.objects.values_list("state", flat=True).get(pk=job.pk) == "launching":
                time.sleep(0.01)
    finally:
        worker.stop()
    ms = lambda values, q: percentile(values, q) * 1000  # noqa: E731
    print(f"no-op task, .delay() → start: p50 {ms(noop, 50):.1f} ms, p99 {ms(noop, 99):.1f} ms")
    print(
        f"approval → launch task start: p50 {ms(dispatch, 50):.1f} ms, "
        f"p99 {ms(dispatch, 99):.1f} ms (two task hops and the admission transaction)"
    )
    print(
        f"  of which approval → admitted (attempt created): p50 {ms(admit_hop, 50):.1f} ms; "
        f"admitted → launch task start: p50 {ms(launch_hop, 50):.1f} ms"
    )
    print(f"ratio dispatch / no-op (p50): {percentile(dispatch, 50) / percentile(noop, 50):.1f}")
    print(f"goal p50 < 25 ms: {'met' if percentile(dispatch, 50) < 0.025 else 'not met'}")


if __name__ == "__main__":
    main()
