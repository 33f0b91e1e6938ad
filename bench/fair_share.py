"""What fair share's memory costs, on PostgreSQL: folding ended reservations into the workspaces'
decayed usage, and ordering an admission pass by it.

The organisation of ``bench/admission.py`` (100 workspaces each guaranteed 10 of 1,000 CPUs,
1-CPU jobs, ``fair_share``), with 21,000 jobs queued (at the default 10 rounds). Rounds
alternate, so both sides of each comparison see the same database:

- release: the jobs a pass admitted (1,000, spread over the 100 workspaces) are released either
  the old way (one UPDATE of ``released_at``) or through ``reservations_release`` (the same
  UPDATE after locking the rows, and the fold: three more queries whatever the count);
- admission: a pass with each workspace's past usage present (the ledger reads it, and every
  key adds the decayed usage share) or with none (the rows deleted, untimed, before the pass).

    .venv/bin/python bench/fair_share.py [--rounds 10]

Prints the median of each side, per job, and the ratio new ÷ old; then the same release for one
job at a time (400 jobs, alternating), where the fold's fixed queries are not shared.
"""

from __future__ import annotations

import argparse
import statistics
import time

from admission import build
from common import BROKER, configure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    configure(
        "manta_bench_fair_share",
        LOG_LEVEL="ERROR",
        MANTA_LOCAL_CAPACITY="cpu=1000000,memory_gb=1000000,gpu=1000000",
    )
    import redis
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from jobs import admission
    from jobs.models import Job
    from quotas import services as quota_services
    from quotas.models import FairShareUsage, Reservation

    org = build(args.rounds * 2 * 1000 + 1000)  # every pass admits 1,000, and one more
    timings: dict[str, list[float]] = {
        key: [] for key in ("update", "fold", "none", "past", "single update", "single fold")
    }
    queries: dict[str, int] = {}
    for index in range(args.rounds * 2):
        with_past = index % 2 == 1
        if not with_past:
            FairShareUsage.objects.all().delete()
        started = time.perf_counter()
        ids = admission.admit(org.pk)
        timings["past" if with_past else "none"].append((time.perf_counter() - started) / len(ids))
        Job.objects.filter(pk__in=ids).update(state="succeeded", finished_at=timezone.now())
        fold = not with_past  # the next pass is one with past usage: this release makes it
        with transaction.atomic(), CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            if fold:
                released = quota_services.reservations_release(ids)
            else:
                released = Reservation.objects.filter(
                    job_id__in=ids, released_at__isnull=True
                ).update(released_at=timezone.now())
            timings["fold" if fold else "update"].append((time.perf_counter() - started) / released)
        queries["fold" if fold else "update"] = len(captured)
        redis.Redis.from_url(BROKER).flushdb()  # the launch tasks nobody consumes

    # One job ending at a time, the usual case: the fold's fixed queries are not shared.
    ids = admission.admit(org.pk)[:400]
    for index, job_id in enumerate(ids):
        fold = index % 2 == 1
        with transaction.atomic():
            started = time.perf_counter()
            if fold:
                quota_services.reservations_release([job_id])
            else:
                Reservation.objects.filter(job_id=job_id, released_at__isnull=True).update(
                    released_at=timezone.now()
                )
            timings["single " + ("fold" if fold else "update")].append(
                time.perf_counter() - started
            )

    def median_ms(key: str) -> float:
        return statistics.median(timings[key]) * 1000

    print(f"{args.rounds * 2} rounds of 1,000 jobs over 100 workspaces")
    print(
        f"release: update only {median_ms('update'):.4f} ms/job ({queries['update']} queries), "
        f"with the fold {median_ms('fold'):.4f} ms/job ({queries['fold']} queries), "
        f"ratio {median_ms('fold') / median_ms('update'):.2f}"
    )
    print(
        f"one job at a time: update only {median_ms('single update'):.3f} ms, with the fold "
        f"{median_ms('single fold'):.3f} ms"
    )
    print(
        f"admission pass: no past usage {median_ms('none'):.4f} ms/job, with past usage "
        f"{median_ms('past'):.4f} ms/job, ratio {median_ms('past') / median_ms('none'):.2f}"
    )


if __name__ == "__main__":
    main()
