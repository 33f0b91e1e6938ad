"""Warm pools with a real Celery worker and real Ray: a job of the pool's shape takes a warm
cluster and succeeds; the pool refills; the next warm cluster is fresh (its own sandbox dir and
token; nothing the earlier tenant wrote is readable); an exhausted pool falls back to a cold
start; an idle cluster past its timeout is stopped; a worker SIGKILLed while it fills the pool
leaves no cluster unaccounted for. The tests run in order on one worker."""

from __future__ import annotations

import os
import time

import pytest

from config import secrets
from jobs.models import JobAttempt, WarmCluster, WarmPool
from tests.e2e.conftest import cluster_processes
from tests.e2e.test_launch import (
    TERMINAL,
    assert_cluster_gone,
    make_template,
    py,
    submit,
    wait_for,
)
from tests.e2e.test_launch import world as world

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

POOLS = "/api/v1/orgs/acme/warm-pools/"
SHAPE = {"image": "rayproject/ray:2.60.0", "head": {"cpu": 1, "memory_gb": 1}, "worker_groups": []}
WRITE_SECRET = py(
    "import os; open(os.path.join(os.environ['HOME'], 'secret'), 'w').write('A'); "
    "open('/tmp/secret', 'w').write('A'); print('wrote')"
)
CHECK_FRESH = py(
    "import os, sys; home = os.path.join(os.environ['HOME'], 'secret'); "
    "seen = [p for p in (home, '/tmp/secret') if os.path.exists(p)]; "
    "print('seen', seen); sys.exit(3 if seen else 0)"
)


def until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"never: {what}")


def idle(pool_id: int) -> list[WarmCluster]:
    return list(WarmCluster.objects.filter(pool_id=pool_id, state="idle"))


def handle(cluster: WarmCluster) -> dict:
    return secrets.decrypt_json(cluster.handle_encrypted)


@pytest.fixture
def pool(world):
    admin = world.client("org_admin")
    existing = WarmPool.objects.filter(organization__slug="acme").first()
    if existing is None:
        response = admin.post(POOLS, {"spec": SHAPE, "size": 1}, format="json")
        assert response.status_code == 201, response.content
        return response.json()["id"]
    admin.patch(f"{POOLS}{existing.pk}/", {"size": 1}, format="json")
    return existing.pk


def test_a_warm_job_succeeds_the_pool_refills_fresh_and_an_empty_pool_starts_cold(
    world, pool, ray_work_dir
):
    [first] = until(lambda: idle(pool), 120, "the pool has an idle cluster")
    first_handle = handle(first)
    a = submit(world, make_template(world, entrypoint=WRITE_SECRET, **SHAPE))
    job = wait_for(a, TERMINAL)
    assert job.state == "succeeded", (job.failure_reason, job.message)
    attempt = JobAttempt.objects.get(job_id=a)
    assert attempt.isolation["warm_cluster"] == first.pk  # it took the warm cluster
    first.refresh_from_db()
    assert first.state in ("claimed", "stopped") and first.attempt_id == attempt.pk
    assert_cluster_gone(attempt, ray_work_dir)  # never reused: torn down with its attempt

    [second] = until(lambda: idle(pool), 120, "the pool refilled after use")
    second_handle = handle(second)
    assert second.pk != first.pk
    assert second_handle["token"] != first_handle["token"]
    assert second_handle["temp_dir"] != first_handle["temp_dir"]
    assert not os.path.exists(first_handle["temp_dir"])

    # Two jobs at once with one idle cluster: one takes it, the other starts cold.
    fresh = make_template(world, entrypoint=CHECK_FRESH, **SHAPE)
    b, c = submit(world, fresh), submit(world, fresh)
    for job_id in (b, c):
        job = wait_for(job_id, TERMINAL)
        assert job.state == "succeeded", (job.failure_reason, job.message)
    warm = [
        JobAttempt.objects.get(job_id=job_id).isolation.get("warm_cluster") for job_id in (b, c)
    ]
    assert sorted(warm, key=bool) == [None, second.pk], warm
    pool_row = WarmPool.objects.get(pk=pool)
    assert pool_row.hits == 2 and pool_row.misses == 1


def test_an_idle_cluster_past_its_timeout_is_stopped(world, pool):
    [cluster] = until(lambda: idle(pool), 120, "the pool has an idle cluster")
    temp_dir = handle(cluster)["temp_dir"]
    admin = world.client("org_admin")
    admin.patch(f"{POOLS}{pool}/", {"idle_timeout_seconds": 10}, format="json")
    until(
        lambda: WarmCluster.objects.filter(
            pk=cluster.pk, state="stopped", stop_reason="idle_timeout"
        ).exists(),
        60,
        "the idle cluster timed out",
    )
    until(lambda: not cluster_processes(temp_dir), 30, "its processes are gone")
    admin.patch(f"{POOLS}{pool}/", {"size": 0, "idle_timeout_seconds": 600}, format="json")


def test_a_worker_killed_while_it_fills_the_pool_leaves_no_cluster_behind(
    world, pool, e2e, ray_work_dir
):
    starting = until(
        lambda: WarmCluster.objects.filter(pool_id=pool, state="starting").first(),
        60,
        "a cluster starts",
    )
    until(lambda: cluster_processes(ray_work_dir), 60, "its processes run")
    e2e.kill()
    world.client("org_admin").patch(f"{POOLS}{pool}/", {"size": 0}, format="json")
    e2e.start()
    until(
        lambda: WarmCluster.objects.filter(pk=starting.pk, state="stopped").exists(),
        90,
        "the killed start is reconciled",
    )
    until(lambda: not cluster_processes(ray_work_dir), 60, "no Ray process is left")
    # Its dir goes after its processes (and its loop-mounted disk's unmount): soon, not at once.
    until(
        lambda: not [n for n in os.listdir(ray_work_dir) if n.startswith("mr-")],
        30,
        "its cluster dir is removed",
    )
    live = WarmCluster.objects.exclude(state="stopped")
    assert not live.exists(), list(live.values("pk", "state"))
