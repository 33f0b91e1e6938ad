"""Warm pools on PostgreSQL, without Ray: a warm cluster is claimed by one attempt at most
under concurrent claims; the pools never take the host over its capacity and yield it to
admitted work; idle clusters past their timeout are retired and stopped; the API sizes pools
and refuses bad input naming the field. (Real clusters: tests/e2e/test_warm_pools.py.)"""

from __future__ import annotations

import pytest

from audit.context import Actor
from jobs import admission, pool_upkeep, pools
from jobs import services as job_services
from jobs.models import WarmCluster, WarmClusterState, WarmPool
from jobs.services import job_submit
from tests import factories as f
from tests.conftest import SYSTEM
from tests.jobs.conftest import counter_spec

API = "/api/v1/orgs/acme/warm-pools/"
S = WarmClusterState


def shape(**changes):
    spec = counter_spec(**changes)
    return {key: spec[key] for key in ("image", "head", "worker_groups")}


def test_a_job_takes_only_a_pool_of_its_own_shape(world):
    pool = f.WarmPoolFactory(organization=world.org, spec=shape())
    template = job_services.template_create(
        actor=SYSTEM, workspace=world.ws, name="c", spec=counter_spec()
    ).template
    job = job_submit(actor=Actor.for_user(world.users["owner"]), workspace=world.ws,
                     template=template)  # fmt: skip
    same = pools.shape_key(job.spec, pools.local_target_config(world.org.pk, "local"))
    assert same == pool.shape_key
    bigger = {**job.spec, "worker_groups": [{**job.spec["worker_groups"][0], "replicas": 2}]}
    assert pools.shape_key(bigger, {}) != pool.shape_key
    renamed = {**job.spec, "worker_groups": [{**job.spec["worker_groups"][0], "name": "x"}]}
    assert pools.shape_key(renamed, {}) == pools.shape_key(job.spec, {})


@pytest.fixture
def small_host(settings):
    settings.MANTA_LOCAL_CAPACITY = {"cpu": 4.0, "memory_gb": 64.0, "disk_gb": 1000.0}


def test_a_pool_never_fills_past_the_hosts_capacity(world, small_host, monkeypatch):
    pool = f.WarmPoolFactory(organization=world.org, size=10)
    assert pool.cpu > 0
    fits = int(4.0 // pool.cpu)
    slots = []
    while (slot := pool_upkeep._take_slot(pool.pk)) is not None:
        slots.append(slot)
        assert len(slots) <= 10
    assert len(slots) == fits
    held = pools.held_on_host()
    assert held["cpu"] <= 4.0


def test_idle_warm_clusters_yield_the_host_to_admitted_work(world, small_host):
    pool = f.WarmPoolFactory(organization=world.org, size=10)
    idle = [f.WarmClusterFactory(pool=pool) for _ in range(int(4.0 // pool.cpu))]
    template = job_services.template_create(
        actor=SYSTEM, workspace=world.ws, name="c", spec=counter_spec()
    ).template
    job = job_submit(actor=Actor.for_user(world.users["owner"]), workspace=world.ws,
                     template=template)  # fmt: skip
    assert job.state == "queued"
    assert admission.admit(world.org.pk) == [job.pk]  # admission counts reservations only
    retired = WarmCluster.objects.filter(state=S.RETIRING)
    # just enough of the pool is retired that the host is not over-committed
    held = pools.held_on_host()
    reserved = job.requested_cpu
    live = WarmCluster.objects.filter(state__in=(S.STARTING, S.IDLE))
    assert sum(c.cpu for c in live) + reserved <= 4.0 + 1e-9
    assert 1 <= retired.count() < len(idle) + 1
    assert {c.stop_reason for c in retired} == {"yielded"}
    assert held["cpu"] >= 0
    # the filler waits for room, and the retired clusters are stopped
    assert pool_upkeep._take_slot(pool.pk) is None
    pool_upkeep.pool_stop(list(retired.values_list("pk", flat=True)))
    assert not WarmCluster.objects.filter(state=S.RETIRING).exists()


def test_idle_clusters_past_their_timeout_are_retired_and_stopped(world):
    pool = f.WarmPoolFactory(organization=world.org, size=0)
    WarmPool.objects.filter(pk=pool.pk).update(idle_timeout_seconds=60)
    import datetime as dt

    from django.utils import timezone

    old = f.WarmClusterFactory(pool=pool, ready_at=timezone.now() - dt.timedelta(minutes=5))
    pool_upkeep.pools_reconcile()
    old.refresh_from_db()
    assert old.state == S.STOPPED and old.stop_reason == "idle_timeout"


# --- the API ----------------------------------------------------------------------------------


def test_an_org_admin_sizes_a_pool_and_members_see_its_levels(world):
    admin = world.client("org_admin")
    body = {"spec": shape(), "size": 0, "idle_timeout_seconds": 300}
    created = admin.post(API, body, format="json")
    assert created.status_code == 201, created.content
    pool = created.json()
    assert pool["target_name"] == "local" and pool["size"] == 0 and pool["cpu"] > 0
    f.WarmClusterFactory(pool=WarmPool.objects.get(pk=pool["id"]))
    listed = world.client("member").get(API).json()["results"]
    assert [(p["id"], p["idle"], p["claimed"], p["hits"]) for p in listed] == [
        (pool["id"], 1, 0, 0)
    ]
    assert listed[0]["oldest_idle_age_seconds"] >= 0
    resized = admin.patch(f"{API}{pool['id']}/", {"size": 2}, format="json")
    assert resized.status_code == 200 and resized.json()["size"] == 2


@pytest.mark.parametrize(
    "body, field",
    [
        ({"spec": "big"}, "spec"),
        ({"spec": {"head": {"cpu": -1}}}, "spec.head.cpu"),
        ({"spec": {"image": "x", "entrypoint": "y"}}, "spec.entrypoint"),
        ({"size": 1000}, "size"),
        ({"idle_timeout_seconds": 1}, "idle_timeout_seconds"),
        ({"target_name": "nowhere"}, "target_name"),
    ],
)
def test_bad_pool_input_is_refused_naming_the_field(world, body, field):
    response = world.client("org_admin").post(API, {"spec": shape(), **body}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()


def test_a_second_pool_of_the_same_shape_is_refused(world):
    admin = world.client("org_admin")
    assert admin.post(API, {"spec": shape()}, format="json").status_code == 201
    again = admin.post(API, {"spec": shape()}, format="json")
    assert again.status_code == 400 and "spec" in again.json()["errors"]


def test_the_warm_cluster_an_admitted_job_will_claim_is_not_the_one_stopped(world, settings):
    mine = f.WarmPoolFactory(organization=world.org, spec=shape())
    other = f.WarmPoolFactory(organization=world.org)  # another shape
    kept, spare = f.WarmClusterFactory(pool=mine), f.WarmClusterFactory(pool=other)
    # The host holds exactly the two idle clusters: a job of mine's shape needs mine's room.
    settings.MANTA_LOCAL_CAPACITY = {
        "cpu": mine.cpu + other.cpu, "memory_gb": 1000.0, "disk_gb": 10000.0
    }  # fmt: skip
    template = job_services.template_create(
        actor=SYSTEM, workspace=world.ws, name="c", spec=counter_spec()
    ).template
    job = job_submit(actor=Actor.for_user(world.users["owner"]), workspace=world.ws,
                     template=template)  # fmt: skip
    assert job.requested_cpu == mine.cpu
    assert admission.admit(world.org.pk) == [job.pk]
    kept.refresh_from_db()
    spare.refresh_from_db()
    # its room passes to the job, which claims it: nothing needs to yield
    assert (kept.state, spare.state) == (S.IDLE, S.IDLE)
    # a job of another shape makes the other pool's cluster yield, never the one it cannot use
    bigger = job_submit(actor=Actor.for_user(world.users["owner"]), workspace=world.ws,
                        template=template)  # fmt: skip
    settings.MANTA_LOCAL_CAPACITY = {
        **settings.MANTA_LOCAL_CAPACITY,
        "cpu": 2 * mine.cpu + other.cpu,
    }
    WarmCluster.objects.filter(pk=kept.pk).update(state=S.CLAIMED)  # the first job took it
    assert admission.admit(world.org.pk) == [bigger.pk]
    spare.refresh_from_db()
    assert spare.state == S.IDLE  # mine's shape again: the host still has room for both
