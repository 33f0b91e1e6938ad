"""Celery dispatch latency: from a job's approval to its launch task starting on a worker, while
the webhook dispatcher is busy.

The jobs target a ``ray`` compute target with nothing listening, so each launch fails at once
and no cluster is started: only the dispatch is measured. All the while, webhook endpoints on a
slow local receiver (127.0.0.1, ``--receiver-delay`` per request) have a backlog of a few hundred
deliveries, topped up as it drains: a launch must not wait behind them. Baseline, in the same
run and against the same workers: a no-op task (``manta.probe``) from ``.delay()`` to its start.

    .venv/bin/python bench/dispatch.py [--jobs 50] [--backlog 300] [--endpoints 4]

Prints p50/p99 of both, their ratio, and how busy the dispatcher was (goal: dispatch p50 under
25 ms with Redis).
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common import BROKER, CeleryWorkers, bench_workspace, configure, percentile


def slow_receiver(delay: float) -> tuple[ThreadingHTTPServer, str, list[float]]:
    """A webhook receiver on 127.0.0.1 that takes ``delay`` seconds to answer each POST, and
    the times it answered them."""
    answered: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(delay)
            self.send_response(204)
            self.end_headers()
            answered.append(time.monotonic())

        def log_message(self, *_args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/hook", answered


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=300, help="pending deliveries kept")
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--receiver-delay", type=float, default=0.1)
    args = parser.parse_args()
    env = configure(
        "manta_bench_dispatch", WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8", WEBHOOK_ALLOW_HTTP="true"
    )
    import redis
    from django.db import transaction

    from audit.context import Actor
    from config.celery import probe
    from jobs import services as job_services
    from jobs.models import Job, JobAttempt, JobEvent
    from notifications import services as hooks
    from notifications.models import WebhookDelivery
    from outbox import services as outbox

    setup = bench_workspace(
        {"image": "rayproject/ray:2.60.0", "entrypoint": "python -V"},
        target={"name": "nowhere", "kind": "ray", "config": {"address": "http://127.0.0.1:9"}},
    )
    org, ws = setup["ws"].organization, setup["ws"]
    server, url, answered = slow_receiver(args.receiver_delay)
    for _ in range(args.endpoints):
        hooks.webhook_create(
            actor=Actor.system("bench"), organization=org, workspace=ws, url=url,
            event_types=["*"],
        )  # fmt: skip
    pending = WebhookDelivery.objects.filter(state="pending")

    def top_up() -> int:
        """Keep about ``--backlog`` deliveries waiting: emit events for what was delivered."""
        waiting = pending.count()
        missing = (args.backlog - waiting) // args.endpoints
        if missing > 0:
            entry = {"type": "job.succeeded", "organization": org, "workspace": ws,
                     "payload": {"job": {"id": 0, "name": "backlog"}}}  # fmt: skip
            with transaction.atomic():
                outbox.event_emit_many(entries=[entry] * missing)
        return waiting

    workers = CeleryWorkers(env, concurrency=2)
    store = redis.Redis.from_url(BROKER)
    noop, dispatch, admit_hop, launch_hop, backlog = [], [], [], [], []
    try:
        for _ in range(5):  # warm up both paths
            probe.delay(f"warm-{uuid.uuid4()}")
        top_up()
        time.sleep(2)  # the dispatcher fans the backlog out and the deliveries start
        started_at = time.monotonic()
        for _ in range(args.jobs):
            backlog.append(top_up())
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
        ended_at = time.monotonic()
        elapsed = ended_at - started_at
        # answered by the receiver while measuring (a batch's outcomes are committed at its end)
        delivered = sum(started_at <= at <= ended_at for at in answered)
    finally:
        workers.stop()
        server.shutdown()
    ms = lambda values, q: percentile(values, q) * 1000  # noqa: E731
    print(
        f"webhook backlog while measuring: {min(backlog)}–{max(backlog)} deliveries pending "
        f"on {args.endpoints} endpoints ({args.receiver_delay * 1000:.0f} ms per request); "
        f"{delivered} delivered (answered by the receiver) in the {elapsed:.1f} s run"
    )
    print(f"no-op task, .delay() → start: p50 {ms(noop, 50):.1f} ms, p99 {ms(noop, 99):.1f} ms")
    print(
        f"approval → launch task start: p50 {ms(dispatch, 50):.1f} ms, "
        f"p99 {ms(dispatch, 99):.1f} ms"
    )
    print(
        f"  of which approval → admitted (attempt created): p50 {ms(admit_hop, 50):.1f} ms; "
        f"admitted → launch task start: p50 {ms(launch_hop, 50):.1f} ms"
    )
    print(f"ratio dispatch / no-op (p50): {percentile(dispatch, 50) / percentile(noop, 50):.1f}")
    print(f"goal p50 ≤ 25 ms: {'met' if percentile(dispatch, 50) <= 0.025 else 'not met'}")


if __name__ == "__main__":
    main()
