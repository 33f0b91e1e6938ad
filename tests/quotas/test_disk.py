"""Disk is a resource: each node's disk_gb is in the spec (a default where it names none),
admission holds it against workspace limits, org capacity and the local host's free space, and
on the local host's sandboxes a job reserves exactly what they allow it: CPU, memory and disk."""

from __future__ import annotations

import os

import pytest

from audit.context import Actor
from jobs import admission, launch_requests, local_host
from jobs import services as job_services
from jobs.launchers.local.isolation import GIB
from jobs.models import Job
from jobs.spec import MAX_DISK_GB, validate_spec
from quotas.models import OrgQuota, Reservation, WorkspaceQuota
from tests.conftest import SYSTEM
from tests.jobs.conftest import counter_spec
from workspaces.models import ComputeTarget

JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"
TEMPLATES = "/api/v1/orgs/acme/workspaces/ml/templates/"
NODES = {
    "head": {"cpu": 0, "memory_gb": 2, "gpu": 0},
    "worker_groups": [
        {"name": "small", "replicas": 2, "cpu": 1, "memory_gb": 1, "disk_gb": 4},
        {"name": "big", "replicas": 1, "cpu": 3, "memory_gb": 6, "disk_gb": 30},
    ],
}


@pytest.fixture
def sized(world):
    """A template whose submitters choose the nodes."""
    return job_services.template_create(
        actor=SYSTEM,
        workspace=world.ws,
        name="sized",
        spec=counter_spec(**NODES),
        allowed_overrides=["head", "worker_groups"],
    ).template


def submit(world, template, **overrides):
    return job_services.job_submit(
        actor=Actor.for_user(world.users["developer"]),
        workspace=world.ws,
        template=template,
        overrides=overrides,
    )


def disk_job(disk_gb: float) -> dict:
    """Overrides for a job of one head, 1 CPU and ``disk_gb`` of disk in all."""
    return {"head": {"cpu": 1, "memory_gb": 1, "disk_gb": disk_gb}, "worker_groups": []}


# --- the spec ----------------------------------------------------------------------------------


def test_a_node_without_disk_gb_gets_the_default(world, settings):
    spec = validate_spec(counter_spec(), organization=world.org)
    assert spec["head"]["disk_gb"] == 10.0
    assert [g["disk_gb"] for g in spec["worker_groups"]] == [10.0]
    settings.MANTA_DEFAULT_NODE_DISK_GB = 3
    spec = validate_spec(counter_spec(head={"cpu": 1, "disk_gb": 7}), organization=world.org)
    assert spec["head"]["disk_gb"] == 7 and spec["worker_groups"][0]["disk_gb"] == 3


@pytest.mark.parametrize(
    ("nodes", "field"),
    [
        ({"head": {"cpu": 0, "disk_gb": -1}}, "head.disk_gb"),
        ({"head": {"cpu": 0, "disk_gb": 0}}, "head.disk_gb"),
        ({"head": {"cpu": 0, "disk_gb": MAX_DISK_GB + 1}}, "head.disk_gb"),
        (
            {"worker_groups": [{"name": "w", "replicas": 1, "cpu": 1, "disk_gb": -5}]},
            "worker_groups.0.disk_gb",
        ),
        (
            {"worker_groups": [{"name": "w", "replicas": 1, "cpu": 1, "disk_gb": 1e12}]},
            "worker_groups.0.disk_gb",
        ),
    ],
)
def test_a_negative_or_too_large_disk_is_a_400_naming_it(world, sized, nodes, field):
    client = world.client("ws_admin")
    response = client.post(TEMPLATES, {"name": "t", **counter_spec(**nodes)}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    response = world.client("developer").post(
        JOBS, {"template": sized.pk, "overrides": nodes}, format="json"
    )
    assert response.status_code == 400, response.content
    assert f"overrides.{field}" in response.json()["errors"], response.json()
    assert not Job.objects.exists()


# --- what a job reserves -----------------------------------------------------------------------


@pytest.mark.parametrize("object_store", [None, 200 * 1024**2])
def test_a_sandboxed_local_job_reserves_exactly_what_its_sandbox_allows(world, sized, object_store):
    if object_store:
        config = {"object_store_memory_bytes": object_store}
        ComputeTarget.objects.create(
            organization=world.org, name="local", kind="local", config=config
        )
    job = submit(world, sized)
    assert admission.admit(world.org.pk) == [job.pk]
    held = Reservation.objects.get(job=job)
    isolation = launch_requests.plan_for(job)["isolation"]
    limits = isolation["limits"]

    # To the byte: the cgroups' CPUs and memory, the disk image's size.
    assert held.cpu == sum(limits["cpu"].values()) == 1 + 2 * 1 + 3  # the head's 0 is 1
    assert held.memory_gb * GIB == limits["memory_bytes"]
    assert held.disk_gb * GIB == limits["disk_bytes"] == (10 + 2 * 4 + 30) * GIB
    assert held.gpu == 0
    store = object_store or int(2 * GIB * 0.3)
    assert limits["nodes"]["h"]["memory_bytes"] == 2 * GIB + store + GIB
    # The plan shows each node's footprint and that their total is the reservation.
    footprint = isolation["footprint"]
    assert (
        footprint["total"]
        == footprint["reserved"]
        == {
            "cpu": held.cpu,
            "memory_gb": held.memory_gb,
            "disk_gb": held.disk_gb,
        }
    )
    assert footprint["nodes"]["h"]["cpu"] == 1.0
    assert set(footprint["nodes"]) == {"h", "w0", "w1", "w2"}


def test_the_operators_minimum_cpu_is_what_a_small_node_reserves(world, sized, settings):
    settings.MANTA_LOCAL_MIN_NODE_CPU = 0.5
    job = submit(world, sized)
    assert job.requested["cpu"] == 0.5 + 2 * 1 + 3
    limits = launch_requests.plan_for(job)["isolation"]["limits"]
    assert sum(limits["cpu"].values()) == job.requested["cpu"]


@pytest.mark.parametrize("where", ["ray", "unsandboxed"])
def test_elsewhere_a_job_reserves_what_its_spec_asks(world, sized, settings, where):
    if where == "ray":
        ComputeTarget.objects.create(
            organization=world.org, name="shared", kind="ray", config={"address": "http://ray:8265"}
        )
        world.ws.compute_target = "shared"
        world.ws.save(update_fields=["compute_target"])
    else:
        settings.MANTA_LOCAL_ISOLATION = "off"
    job = submit(world, sized)
    # head 0 CPU / 2 GB / 10 GB disk (the default) + 2 x (1, 1, 4) + (3, 6, 30)
    assert job.requested == {"cpu": 5.0, "memory_gb": 10.0, "gpu": 0.0, "disk_gb": 48.0}


# --- admission ---------------------------------------------------------------------------------


def test_disk_blocks_admission_at_the_hosts_capacity(world, sized, settings):
    settings.MANTA_LOCAL_CAPACITY = {"cpu": 1e6, "memory_gb": 1e6, "disk_gb": 50}
    first, second, third = (submit(world, sized, **disk_job(gb)) for gb in (20, 20, 20))
    assert admission.admit(world.org.pk) == [first.pk, second.pk]
    third.refresh_from_db()
    assert admission.explain(third)["waiting_for"] == (
        "this host's disk_gb capacity 50: 40 reserved by all organisations, this job needs 20"
    )
    # one that could never fit on the host is refused at submit, naming the resource
    response = world.client("developer").post(
        JOBS, {"template": sized.pk, "overrides": disk_job(60)}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["requested.disk_gb"] == [
        "this job needs 60 disk_gb; the host its workspace launches on has 50, so it could "
        "never run"
    ]


def test_disk_blocks_admission_at_a_workspace_limit_and_the_org_capacity(world, sized):
    WorkspaceQuota.objects.create(workspace=world.ws, limit_disk_gb=30)
    first, second = submit(world, sized, **disk_job(20)), submit(world, sized, **disk_job(20))
    assert admission.admit(world.org.pk) == [first.pk]
    assert Reservation.objects.get(job=first).disk_gb == 20
    second.refresh_from_db()
    assert admission.explain(second)["waiting_for"] == (
        "workspace disk_gb limit 30: 20 reserved, this job needs 20"
    )
    WorkspaceQuota.objects.filter(workspace=world.ws).update(limit_disk_gb=None)
    OrgQuota.objects.create(organization=world.org, disk_gb=35)
    assert admission.admit(world.org.pk) == []
    assert admission.explain(second)["waiting_for"] == (
        "organisation disk_gb capacity 35: 20 reserved, this job needs 20"
    )


def test_a_job_over_the_workspace_disk_limit_is_refused_at_submit(world, sized):
    response = world.client("org_admin").patch(
        "/api/v1/orgs/acme/workspaces/ml/quota/", {"limit_disk_gb": 15}, format="json"
    )
    assert response.status_code == 200 and response.json()["limit_disk_gb"] == 15
    response = world.client("developer").post(
        JOBS, {"template": sized.pk, "overrides": disk_job(16)}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["requested.disk_gb"] == [
        "this job needs 16 disk_gb; the workspace limit is 15, so it could never run"
    ]
    assert not Job.objects.exists()


def test_usage_shows_the_disk_held(world, sized):
    submit(world, sized, **disk_job(12))
    admission.admit(world.org.pk)
    usage = world.client("viewer").get("/api/v1/orgs/acme/workspaces/ml/usage/").json()
    assert usage["reserved"]["disk_gb"] == 12
    assert usage["guaranteed"]["disk_gb"] == 0 and usage["limit"]["disk_gb"] is None


# --- the host's disk ---------------------------------------------------------------------------


def test_the_hosts_disk_is_the_free_space_where_clusters_live_less_the_reserve(settings, tmp_path):
    settings.MANTA_LOCAL_CAPACITY = {}
    settings.MANTA_LOCAL_RAY_DIR = str(tmp_path / "not" / "made" / "yet")
    settings.MANTA_LOCAL_RESERVE_DISK_GB = 1
    stats = os.statvfs(tmp_path)
    free = stats.f_bavail * stats.f_frsize / GIB
    assert local_host.capacity()["disk_gb"] == pytest.approx(max(0, free - 1), abs=0.2)
    settings.MANTA_LOCAL_RESERVE_DISK_GB = 1_000_000
    assert local_host.capacity()["disk_gb"] == 0
    settings.MANTA_LOCAL_CAPACITY = {"disk_gb": 123.0}
    assert local_host.capacity()["disk_gb"] == 123.0
