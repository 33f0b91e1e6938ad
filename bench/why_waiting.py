"""What a queued job's why-waiting costs (``jobs.admission.explain``) with a deep queue, under
each policy: for a job blocked on its own (the ledger answers) and for the last job of the
queue fitting on its own behind a head that does not (the dry pass of ``jobs/waiting.py``
answers).

    .venv/bin/python bench/why_waiting.py [--queued 100000] [--calls 20]

The world is bench/submit.py's (``BENCH_SUBMIT_DB``), with ``--queued`` jobs of one workspace
queued in bulk; the organisation's CPU capacity is set so that the first job does not fit and
(in the second case) the last one does. Prints the mean CPU and wall time per call and what it
says.
"""

from __future__ import annotations

import argparse
import time

from submit import queue_in_bulk, set_up

POLICIES = ("fifo", "round_robin", "fair_share")


def timed(explain, job, calls: int) -> tuple[float, float, str]:
    """Mean CPU and wall milliseconds of ``explain(job)``, and its ``waiting_for``."""
    said = explain(job)["waiting_for"]  # warm
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        explain(job)
    calls_ms = 1000 / calls
    return (time.process_time() - cpu) * calls_ms, (time.perf_counter() - wall) * calls_ms, said


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=20)
    options = parser.parse_args()
    _, world = set_up()
    from jobs.admission import explain
    from jobs.models import Job
    from quotas.models import OrgQuota

    org = world["ws"].organization
    queue_in_bulk(world, options.queued)
    queued = Job.objects.filter(organization=org, state="queued").order_by("queued_at", "id")
    head, last = queued.first(), queued.last()
    need = head.requested_cpu
    print(f"{options.queued:,} queued jobs; mean of {options.calls} calls")
    # The last job: kept out by the capacity itself, then (the head made twice as large)
    # fitting on its own behind a head that does not.
    for name, capacity, head_asks in (
        ("blocked on its own", need * 0.5, need),
        ("last, fits on its own behind the head", need * 1.5, need * 2),
    ):
        Job.objects.filter(pk=head.pk).update(requested_cpu=head_asks)
        for policy in POLICIES:
            OrgQuota.objects.update_or_create(
                organization=org, defaults={"cpu": capacity, "policy": policy}
            )
            cpu, wall, said = timed(explain, Job.objects.get(pk=last.pk), options.calls)
            print(f"{policy:12} {name:38} {cpu:7.1f} ms CPU {wall:7.1f} ms  {said[:80]}")


if __name__ == "__main__":
    main()
