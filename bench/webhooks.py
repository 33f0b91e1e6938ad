"""Webhook delivery: throughput to a local receiver with one worker process, and the latency from
an event's commit to its signed delivery arriving.

The receiver is ``scripts/webhook_receiver.py`` in its own process (it verifies every signature
and logs arrival times). The worker is one Celery process (``--concurrency 1``) on Redis.

- Throughput: N outbox rows committed in one transaction (as the admission scheduler writes
  them); the clock runs from the commit to the N-th message arriving. Baseline, same run: the same
  number of POSTs of the same bodies sent from this process straight to the receiver over one
  kept-alive connection (the receiver's ceiling for one sequential client).
- Latency: events committed one at a time (``event_emit``), each waited for before the next; the
  clock runs from the commit to the arrival. Baseline, same run: a no-op Celery task from
  ``.delay()`` to its start on the same worker (``manta.probe``).

    .venv/bin/python bench/webhooks.py [--events 2000] [--latency-events 200]

Goals: at least 500 deliveries/s, and a p50 latency under 200 ms with Redis.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import BROKER, ROOT, CeleryWorker, configure, percentile


class ReceiverProcess:
    def __init__(self, secret_file: Path, log: Path):
        self.log, self.offset, self.seen = log, 0, {}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "webhook_receiver.py"), "--quiet",
             "--secret-file", str(secret_file), "--log", str(log)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.url = self.proc.stdout.readline().split()[-1] + "/hook"

    def poll(self) -> dict[str, dict]:
        """Entries that arrived since the last call, by webhook-id."""
        with open(self.log) as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        for line in complete.splitlines():
            entry = json.loads(line)
            self.seen[entry["id"]] = entry
        return self.seen

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out: see the worker log")
        time.sleep(0.002)


def direct_posts(url: str, bodies: list[bytes]) -> float:
    """POSTs per second straight to the receiver, sequentially over one connection."""
    import urllib3

    pool = urllib3.PoolManager(maxsize=1)
    headers = {"Content-Type": "application/json", "webhook-id": "msg_direct",
               "webhook-timestamp": str(int(time.time())), "webhook-signature": "v1,x"}  # fmt: skip
    started = time.perf_counter()
    for body in bodies:
        pool.request("POST", url, body=body, headers=headers, retries=False)
    return len(bodies) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--latency-events", type=int, default=200)
    args = parser.parse_args()
    env = configure(
        "manta_bench_webhooks", WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8", WEBHOOK_ALLOW_HTTP="true"
    )
    import redis
    from django.db import transaction

    from audit.context import Actor
    from config.celery import probe
    from notifications import delivery, services
    from notifications.models import WebhookDelivery
    from outbox import services as outbox
    from workspaces import services as ws_services

    system = Actor.system("bench")
    org, _ = ws_services.org_create(actor=system, slug="bench", name="", owner_email="o@b.test")
    ws = ws_services.workspace_create(actor=system, organization=org, slug="w")
    tmp = Path(tempfile.mkdtemp(prefix="manta-bench-hooks-"))
    receiver = ReceiverProcess(tmp / "secret", tmp / "received.jsonl")
    endpoint, secret = services.webhook_create(
        actor=system, organization=org, workspace=ws, url=receiver.url, event_types=["*"]
    )
    (tmp / "secret").write_text(secret)
    payload = {
        "job": {"id": 1, "name": "bench", "state": "launching", "workspace": "w",
                "organization": "bench", "submitted_by": "d@b.test",
                "requested": {"cpu": 2.0, "memory_gb": 4.0, "gpu": 0.0}, "priority": 5,
                "failure_reason": "", "message": ""},
        "reason": "", "actor": "system:scheduler",
    }  # fmt: skip
    worker = CeleryWorker(env, concurrency=1)
    store = redis.Redis.from_url(BROKER)
    try:
        # --- warm up: connections, imports, the worker's first tasks
        for _ in range(3):
            with transaction.atomic():
                outbox.event_emit(type="job.queued", organization=org, workspace=ws,
                                  payload=payload)  # fmt: skip
        wait_until(lambda: len(receiver.poll()) >= 3, 30)

        # --- throughput
        with transaction.atomic():
            entry = {"type": "job.launching", "organization": org, "workspace": ws,
                     "payload": payload}  # fmt: skip
            events = outbox.event_emit_many(entries=[entry] * args.events)
        committed = time.time()
        ids = {f"msg_{e.pk.hex}" for e in events}
        wait_until(lambda: ids <= receiver.poll().keys(), 600)
        arrivals = [receiver.seen[i]["received_at"] for i in ids]
        elapsed = max(arrivals) - committed
        rate = args.events / elapsed
        verified = sum(receiver.seen[i]["verified"] for i in ids)
        sample = WebhookDelivery.objects.filter(endpoint=endpoint).select_related(
            "endpoint__organization", "event__organization", "event__workspace"
        )[:1]
        body = delivery.encode(delivery.message_body(sample[0]))
        ceiling = direct_posts(receiver.url, [body] * args.events)

        # --- latency
        noop, latency = [], []
        for _ in range(args.latency_events):
            key = f"probe-{uuid.uuid4()}"
            sent = time.time()
            probe.delay(key)
            while (value := store.get(key)) is None:
                time.sleep(0.0005)
            noop.append(float(value) - sent)

            with transaction.atomic():
                event = outbox.event_emit(
                    type="job.succeeded", organization=org, workspace=ws, payload=payload
                )
            committed = time.time()
            message_id = f"msg_{event.pk.hex}"
            wait_until(lambda m=message_id: m in receiver.poll(), 30)
            latency.append(receiver.seen[message_id]["received_at"] - committed)
    finally:
        worker.stop()
        receiver.stop()

    ms = lambda values, q: percentile(values, q) * 1000  # noqa: E731
    print(f"throughput: {args.events} events committed in one transaction → delivered in "
          f"{elapsed:.2f} s = {rate:.0f} deliveries/s (one worker process; "
          f"{verified}/{args.events} signatures verified by the receiver)")  # fmt: skip
    print(f"  baseline, direct sequential POSTs to the same receiver: {ceiling:.0f}/s; "
          f"ratio delivered / direct: {rate / ceiling:.2f}")  # fmt: skip
    print(f"latency, commit → signed delivery received: p50 {ms(latency, 50):.1f} ms, "
          f"p99 {ms(latency, 99):.1f} ms over {len(latency)} events")  # fmt: skip
    print(f"  baseline, no-op task .delay() → start: p50 {ms(noop, 50):.1f} ms, "
          f"p99 {ms(noop, 99):.1f} ms; ratio (p50): "
          f"{percentile(latency, 50) / percentile(noop, 50):.1f}")  # fmt: skip
    print(f"goals: ≥ 500 deliveries/s {'met' if rate >= 500 else 'not met'}; "
          f"p50 < 200 ms {'met' if percentile(latency, 50) < 0.2 else 'not met'}")  # fmt: skip


if __name__ == "__main__":
    main()
