"""Claims of warm clusters racing on real PostgreSQL connections (threads): a warm cluster is
handed to one attempt at most, and every claim either gets a cluster of its own or counts a miss.

Its own module: the rows must be committed before the threads look, which a module that shares
a world built in a transaction (``tests/jobs/test_pools.py``) cannot give."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from jobs import pools
from jobs.models import JobAttempt, WarmCluster, WarmClusterState
from tests import factories as f

S = WarmClusterState


def at_once(attempts: list[JobAttempt], claim) -> dict[str, object]:
    """``claim(attempt)`` for every attempt, each on its own thread and connection, all let go
    at the same moment: what each got, by attempt id. Fails the test if any raised."""
    barrier = threading.Barrier(len(attempts))
    got: dict[str, object] = {}
    errors: list[str] = []

    def run(attempt: JobAttempt) -> None:
        try:
            barrier.wait()
            got[str(attempt.pk)] = claim(attempt)
        except Exception as exc:  # reported below, with the claims that worked
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(a,)) for a in attempts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return got


@pytest.mark.django_db(transaction=True)
def test_a_warm_cluster_is_never_handed_to_two_attempts():
    pool = f.WarmPoolFactory(size=3)
    warm = [f.WarmClusterFactory(pool=pool) for _ in range(3)]
    attempts = [f.JobAttemptFactory(job__organization=pool.organization) for _ in range(8)]

    def claim(attempt: JobAttempt) -> int | None:
        cluster = pools.pool_claim(pool=pool, attempt=attempt)
        return cluster and cluster.pk

    got = at_once(attempts, claim)
    taken = [pk for pk in got.values() if pk is not None]
    assert sorted(taken) == sorted(c.pk for c in warm)  # each once, none twice
    rows = WarmCluster.objects.filter(pool=pool)
    assert all(row.state == S.CLAIMED and row.attempt_id for row in rows)
    assert {str(row.attempt_id): row.pk for row in rows} == {
        a: pk for a, pk in got.items() if pk is not None
    }
    pool.refresh_from_db()
    assert (pool.hits, pool.misses) == (3, 5)
