"""Warm pools of a ``kuberay`` target, on PostgreSQL: a pool keeps RayClusters of its shape,
labelled with it, each with its own token; a job of that shape runs as a RayJob whose
``clusterSelector`` names one, which is deleted after the attempt and never reused; idle
timeout, strays and vanished clusters are reconciled against what the API server lists; a job
of another shape starts cold.

The Kubernetes API server is a truly external system that cannot run here: ``KubeStub``
(``tests/launchers/kube_stub.py``), an in-memory stand-in on 127.0.0.1, plays it, reached the
production way (a kubeconfig in the target's config). KubeRay does not run either: nothing
brings the RayClusters' pods up, which is KubeRay's part."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import admission, following, launching, pool_upkeep
from jobs.launch_requests import launch_request, resolve_target
from jobs.launchers.kuberay import validate_rayjob
from jobs.launchers.kuberay.manifest import (
    CLUSTER_SELECTOR_KEY,
    LABEL_ORG,
    LABEL_POOL,
    LABEL_WARM,
    MANAGED_BY,
    render_rayjob,
)
from jobs.models import JobAttempt, WarmCluster, WarmClusterState, WarmPool
from quotas.models import OrgQuota
from tests import factories as f
from tests.jobs.conftest import counter_spec, submit
from tests.launchers.kube_stub import KubeStub

S = WarmClusterState
API = "/api/v1/orgs/acme/warm-pools/"
TARGETS = "/api/v1/orgs/acme/compute-targets/"
WS = "/api/v1/orgs/acme/workspaces/ml/"
CRD_PATH = Path(__file__).resolve().parents[3] / "shared" / "kuberay" / "ray.io_rayjobs.yaml"


def shape(**changes):
    spec = counter_spec(**changes)
    return {key: spec[key] for key in ("image", "head", "worker_groups")}


@pytest.fixture
def stub():
    with KubeStub() as server:
        yield server


@pytest.fixture
def k8s(world, stub):
    """The workspace launches on a kuberay target whose API server is the stub."""
    body = {"name": "k8s", "kind": "kuberay", "config": {"kubeconfig": stub.kubeconfig()}}
    assert world.client("owner").post(TARGETS, body, format="json").status_code == 201
    world.client("owner").patch(WS, {"compute_target": "k8s"}, format="json")
    world.ws.refresh_from_db()
    return f"manta-{world.ws.slug}"  # the default namespace_pattern's namespace


def make_pool(world, size: int, **body) -> WarmPool:
    body = {"target_name": "k8s", "spec": shape(), "workspace": world.ws.slug, **body}
    created = world.client("org_admin").post(API, {"size": size, **body}, format="json")
    assert created.status_code == 201, created.content
    return WarmPool.objects.get(pk=created.json()["id"])


def admitted_attempt(world, template) -> JobAttempt:
    job = submit(world, template)
    assert admission.admit(world.org.pk) == [job.pk]
    return JobAttempt.objects.select_related("job").get(job=job)


def test_a_warm_raycluster_per_slot_with_the_pools_labels_and_a_token_of_its_own(
    world, template, k8s, stub
):
    pool = make_pool(world, 2)
    assert (pool.kind, pool.namespace) == ("kuberay", k8s)
    assert pool_upkeep.pool_fill(pool.pk) == 2
    rows = list(WarmCluster.objects.filter(pool=pool).order_by("pk"))
    assert [row.state for row in rows] == [S.IDLE, S.IDLE]
    assert sorted(stub.rayclusters) == sorted((k8s, f"manta-warm-{row.pk}") for row in rows)
    attempt = admitted_attempt(world, template)  # not launched: its cold RayJob, rendered
    cold = render_rayjob(launch_request(attempt, resolve_target(attempt.job)))
    for row in rows:
        cluster = stub.rayclusters[(k8s, f"manta-warm-{row.pk}")]
        labels = cluster["metadata"]["labels"]
        assert labels == {
            **MANAGED_BY,
            LABEL_ORG: world.org.slug,
            LABEL_POOL: str(pool.pk),
            LABEL_WARM: str(row.pk),
        }
        # Token auth with no secretName: KubeRay generates a Secret for this RayCluster alone
        # (and gives it to the submitter of the RayJob that selects it); none is shared.
        assert cluster["spec"]["authOptions"] == {"mode": "token"}
        # The cluster a cold start of a job of its shape would have KubeRay create.
        groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
        cold_groups = [
            cold["spec"]["rayClusterSpec"]["headGroupSpec"],
            *cold["spec"]["rayClusterSpec"]["workerGroupSpecs"],
        ]
        for warm, job in zip(groups, cold_groups, strict=True):
            assert warm["template"]["spec"] == job["template"]["spec"]
            assert warm["rayStartParams"] == job["rayStartParams"]
        assert row.cpu == pool.cpu > 0  # it holds its share of the capacity
    # full: another fill starts nothing
    assert pool_upkeep.pool_fill(pool.pk) == 0


def test_a_job_of_the_pools_shape_runs_on_a_warm_cluster_which_is_deleted_after_it(
    world, template, k8s, stub
):
    pool = make_pool(world, 1)
    assert pool_upkeep.pool_fill(pool.pk) == 1
    warm = WarmCluster.objects.get(pool=pool)
    attempt = admitted_attempt(world, template)

    launching.attempt_launch(str(attempt.pk))

    attempt.refresh_from_db()
    warm.refresh_from_db()
    assert (warm.state, warm.attempt_id) == (S.CLAIMED, attempt.pk)
    assert attempt.isolation["warm_cluster"] == warm.pk
    rayjob = stub.rayjobs[(k8s, attempt.cluster_name)]
    assert rayjob["spec"]["clusterSelector"] == {CLUSTER_SELECTOR_KEY: f"manta-warm-{warm.pk}"}
    assert "rayClusterSpec" not in rayjob["spec"]
    assert rayjob["spec"]["jobId"] == attempt.submission_id
    assert rayjob["spec"]["backoffLimit"] == 0
    if CRD_PATH.is_file():
        assert validate_rayjob(rayjob, CRD_PATH) == []
    pool.refresh_from_db()
    assert (pool.hits, pool.misses) == (1, 0)

    # the pool refills with a new RayCluster (the claim's on-commit fill, run here)
    assert pool_upkeep.pool_fill(pool.pk) == 1
    fresh = WarmCluster.objects.get(pool=pool, state=S.IDLE)
    assert (k8s, f"manta-warm-{fresh.pk}") in stub.rayclusters

    # the attempt ends: its RayJob and the RayCluster it selected are deleted
    following.attempt_teardown(attempt)
    assert (k8s, attempt.cluster_name) not in stub.rayjobs
    assert (k8s, f"manta-warm-{warm.pk}") not in stub.rayclusters
    assert stub.requests_to(
        "DELETE", f"/apis/ray.io/v1/namespaces/{k8s}/rayclusters/manta-warm-{warm.pk}"
    )
    pool_upkeep.pools_reconcile()
    warm.refresh_from_db()
    assert (warm.state, warm.stop_reason) == (S.STOPPED, "used")
    # never reused: the only idle cluster is the fresh one
    assert list(WarmCluster.objects.filter(pool=pool, state=S.IDLE)) == [fresh]


def test_a_job_of_another_shape_starts_cold(world, template, k8s, stub):
    pool = make_pool(world, 1, spec=shape(image="rayproject/ray:2.59.0"))
    assert pool_upkeep.pool_fill(pool.pk) == 1
    attempt = admitted_attempt(world, template)
    launching.attempt_launch(str(attempt.pk))
    rayjob = stub.rayjobs[(k8s, attempt.cluster_name)]
    assert "clusterSelector" not in rayjob["spec"] and "rayClusterSpec" in rayjob["spec"]
    assert WarmCluster.objects.get(pool=pool).state == S.IDLE
    attempt.refresh_from_db()
    assert "warm_cluster" not in attempt.isolation


def test_a_job_that_asks_kuberay_for_retries_starts_cold(world, k8s, stub):
    pool = make_pool(world, 1)
    assert pool_upkeep.pool_fill(pool.pk) == 1
    retrying = f.JobTemplateFactory(
        workspace=world.ws,
        name="retrying",
        created_by=world.users["ws_admin"],
        version__spec_changes={"max_retries": 2},
    )
    attempt = admitted_attempt(world, retrying)
    launching.attempt_launch(str(attempt.pk))
    rayjob = stub.rayjobs[(k8s, attempt.cluster_name)]
    assert "rayClusterSpec" in rayjob["spec"] and rayjob["spec"]["backoffLimit"] == 2
    assert WarmCluster.objects.get(pool=pool).state == S.IDLE


def test_idle_timeout_deletes_the_raycluster(world, k8s, stub):
    pool = make_pool(world, 1)
    WarmPool.objects.filter(pk=pool.pk).update(idle_timeout_seconds=60)
    assert pool_upkeep.pool_fill(pool.pk) == 1
    warm = WarmCluster.objects.get(pool=pool)
    WarmCluster.objects.filter(pk=warm.pk).update(ready_at=timezone.now() - dt.timedelta(minutes=5))
    counts = pool_upkeep.pools_reconcile()
    warm.refresh_from_db()
    assert (warm.state, warm.stop_reason) == (S.STOPPED, "idle_timeout")
    assert (k8s, f"manta-warm-{warm.pk}") not in stub.rayclusters
    assert counts["fills"] == 1  # and the pool is refilled in the background


def test_reconcile_deletes_strays_and_drops_rows_whose_raycluster_vanished(world, k8s, stub):
    pool = make_pool(world, 2)
    assert pool_upkeep.pool_fill(pool.pk) == 2
    kept, vanished = WarmCluster.objects.filter(pool=pool).order_by("pk")
    # a RayCluster with the pool's labels that no row names (a row never committed)
    stray = dict(stub.rayclusters[(k8s, f"manta-warm-{kept.pk}")])
    stray["metadata"] = {
        **stray["metadata"],
        "name": "manta-warm-999999",
        "labels": {**stray["metadata"]["labels"], LABEL_WARM: "999999"},
    }
    stub.rayclusters[(k8s, "manta-warm-999999")] = stray
    # someone deleted a warm RayCluster behind Manta's back
    del stub.rayclusters[(k8s, f"manta-warm-{vanished.pk}")]
    # a RayCluster of someone else in the namespace is none of the pool's business
    stub.rayclusters[(k8s, "theirs")] = {"metadata": {"name": "theirs", "labels": {}}}

    counts = pool_upkeep.pools_reconcile()

    assert counts["strays"] == 1
    assert sorted(name for _, name in stub.rayclusters) == [f"manta-warm-{kept.pk}", "theirs"]
    vanished.refresh_from_db()
    kept.refresh_from_db()
    assert (vanished.state, vanished.stop_reason) == (S.STOPPED, "lost")
    assert kept.state == S.IDLE


def test_a_pool_never_fills_past_the_organisations_capacity(world, k8s, stub):
    pool = make_pool(world, 5)
    OrgQuota.objects.update_or_create(organization=world.org, defaults={"cpu": 2 * pool.cpu})
    assert pool_upkeep.pool_fill(pool.pk) == 2
    assert len(stub.rayclusters) == 2


def test_bad_kuberay_pool_input_is_refused_naming_the_field(world, k8s):
    admin = world.client("org_admin")
    for body, field in [
        ({"workspace": "nowhere"}, "workspace"),
        ({"gpu_flavor": "h100"}, "gpu_flavor"),
        ({"workspace": ""}, "workspace"),  # the default pattern needs a workspace
        # hostile values: a path, a NUL, an overlong name, a malformed flavor
        ({"workspace": "../../etc"}, "workspace"),
        ({"workspace": "ml\x00x"}, "workspace"),
        ({"workspace": "w" * 65}, "workspace"),
        ({"gpu_flavor": "H100; rm -rf /"}, "gpu_flavor"),
    ]:
        payload = {"target_name": "k8s", "spec": shape(), "workspace": world.ws.slug, **body}
        pools = WarmPool.objects.count()
        response = admin.post(API, payload, format="json")
        assert response.status_code == 400, response.content
        assert field in response.json()["errors"], response.json()
        assert WarmPool.objects.count() == pools
    local = admin.post(API, {"spec": shape(), "workspace": world.ws.slug}, format="json")
    assert local.status_code == 400 and "workspace" in local.json()["errors"]


def test_idle_warm_rayclusters_yield_the_organisations_capacity_to_admitted_work(
    world, template, k8s, stub
):
    other = make_pool(world, 2, spec=shape(image="rayproject/ray:2.59.0"))
    mine = make_pool(world, 1)
    assert pool_upkeep.pool_fill(other.pk) == 2
    assert pool_upkeep.pool_fill(mine.pk) == 1
    # the organisation's capacity is exactly what the three warm clusters hold
    OrgQuota.objects.update_or_create(
        organization=world.org, defaults={"cpu": 2 * other.cpu + mine.cpu}
    )
    job = submit(world, template)  # of mine's shape: it will claim mine's cluster
    assert job.requested_cpu == mine.cpu
    assert admission.admit(world.org.pk) == [job.pk]
    assert not WarmCluster.objects.filter(state=S.RETIRING).exists()  # its room passes on

    second = submit(world, template)  # mine has nothing more for it: the other pool yields
    WarmCluster.objects.filter(pool=mine).update(state=S.CLAIMED)  # the first job took it
    assert admission.admit(world.org.pk) == [second.pk]
    retired = list(WarmCluster.objects.filter(state=S.RETIRING))
    assert [(c.pool_id, c.stop_reason) for c in retired] == [(other.pk, "yielded")]
    pool_upkeep.pool_stop([c.pk for c in retired])
    assert (k8s, f"manta-warm-{retired[0].pk}") not in stub.rayclusters
    assert pool_upkeep._take_slot(other.pk) is None  # no refill into the admitted job's room
