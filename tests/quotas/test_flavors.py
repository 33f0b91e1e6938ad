"""GPU flavors in admission, on a host whose inventory is typed (h100: devices 0 and 1,
a100: devices 2 and 3, and an untyped device 4): a job asking for h100 never takes a100
capacity and says h100 blocks it; a job accepting [h100, a100] falls back to a100; per-flavor
workspace limits and guarantees and org capacities bind; usage is reported per flavor; a
flavor that can never fit is refused at submit (400 naming the field), or named as such while
the job waits."""

import datetime as dt

import pytest
from django.utils import timezone

from audit.context import Actor
from jobs import admission, local_host
from jobs import services as job_services
from jobs.metrics_snapshot import snapshot_refresh
from jobs.models import Job, JobAttempt
from quotas.models import OrgQuota, QuotaGroup, Reservation, WorkspaceQuota
from tests.conftest import SYSTEM
from tests.factories import WorkspaceFactory
from tests.jobs.conftest import counter_spec
from tests.jobs.test_metrics import samples, scrape, value
from workspaces import services as ws_services

JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"
USAGE = "/api/v1/orgs/acme/workspaces/ml/usage/"
ORG_Q = "/api/v1/orgs/acme/quota/"
WS_Q = "/api/v1/orgs/acme/workspaces/ml/quota/"


@pytest.fixture
def typed_host(settings):
    settings.MANTA_LOCAL_GPUS = ("0", "1", "2", "3", "4")
    settings.MANTA_LOCAL_GPU_FLAVORS = {"0": "h100", "1": "h100", "2": "a100", "3": "a100"}
    # The GPUs are what binds here, not this machine's few CPUs, its memory or its disk.
    settings.MANTA_LOCAL_CAPACITY = {"cpu": 1e6, "memory_gb": 1e6, "disk_gb": 1e6}
    local_host.gpu_inventory.cache_clear()
    yield
    local_host.gpu_inventory.cache_clear()


def gpu_template(workspace):
    return job_services.template_create(
        actor=SYSTEM,
        workspace=workspace,
        name="gpu",
        spec=counter_spec(worker_groups=[]),
        allowed_overrides=["worker_groups", "priority", "gpu_flavor", "max_runtime_seconds"],
    ).template


def overrides(gpu, flavor=None):
    body = {"worker_groups": [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": gpu}]}
    if flavor is not None:
        body["gpu_flavor"] = flavor
    return body


def queue(world, ws, template, gpu, flavor=None, *, minutes_ago=0):
    job = job_services.job_submit(
        actor=Actor.for_user(world.users["owner"]),
        workspace=ws,
        template=template,
        overrides=overrides(gpu, flavor),
    )
    Job.objects.filter(pk=job.pk).update(
        queued_at=timezone.now() - dt.timedelta(minutes=minutes_ago)
    )
    return job.pk


def policy(world, name="round_robin", **extra):
    OrgQuota.objects.update_or_create(organization=world.org, defaults={"policy": name, **extra})


def held_by_flavor() -> dict[str, float]:
    rows = Reservation.objects.filter(released_at=None).values_list("gpu_flavor", "gpu")
    held: dict[str, float] = {}
    for flavor, gpus in rows:
        held[flavor] = held.get(flavor, 0) + gpus
    return held


def flavor_of(job_id: int) -> str:
    return JobAttempt.objects.get(job_id=job_id).gpu_flavor


def test_an_h100_job_never_takes_a100_capacity_and_names_h100_while_it_waits(world, typed_host):
    template = gpu_template(world.ws)
    policy(world)
    first = queue(world, world.ws, template, 2, "h100", minutes_ago=3)
    second = queue(world, world.ws, template, 1, "h100", minutes_ago=2)
    other = queue(world, world.ws, template, 1, "a100", minutes_ago=1)

    assert admission.admit(world.org.pk) == [first, other]
    assert flavor_of(first) == "h100" and flavor_of(other) == "a100"
    assert held_by_flavor() == {"h100": 2, "a100": 1}  # one a100 is free: never taken by h100
    assert Job.objects.get(pk=second).state == "queued"

    waiting = world.client("developer").get(f"{JOBS}{second}/").json()
    assert waiting["queue"]["waiting_for"] == (
        "this host's GPU flavor h100 capacity 2: 2 reserved, this job needs 1"
    )
    detail = world.client("developer").get(f"{JOBS}{first}/").json()
    assert detail["gpu_flavor"] == "h100" and detail["attempts"][0]["gpu_flavor"] == "h100"
    assert detail["spec"]["gpu_flavor"] == ["h100"]
    snapshot_refresh()  # and /metrics counts it as waiting for its flavor
    found = samples(scrape())
    tenant = {"organization": "acme", "workspace": "ml"}
    assert value(found, "manta_pending_jobs", **tenant, reason="gpu_flavor") == 1
    assert value(found, "manta_pending_jobs", **tenant, reason="admission_pass") == 0


def test_a_job_accepting_h100_then_a100_falls_back_to_a100(world, typed_host):
    template = gpu_template(world.ws)
    policy(world)
    full = queue(world, world.ws, template, 2, "h100", minutes_ago=2)
    either = queue(world, world.ws, template, 2, ["h100", "a100"], minutes_ago=1)
    assert admission.admit(world.org.pk) == [full, either]
    assert flavor_of(either) == "a100"
    assert held_by_flavor() == {"h100": 2, "a100": 2}
    # Both full now: a third that accepts both names both, in its order.
    third = queue(world, world.ws, template, 1, ["a100", "h100"])
    assert admission.admit(world.org.pk) == []
    reason = admission.explain(Job.objects.get(pk=third))["waiting_for"]
    assert reason == (
        "this host's GPU flavor a100 capacity 2: 2 reserved, this job needs 1; "
        "this host's GPU flavor h100 capacity 2: 2 reserved, this job needs 1"
    )


def test_a_job_without_a_flavor_takes_the_first_that_fits_in_inventory_order(world, typed_host):
    template = gpu_template(world.ws)
    policy(world)
    jobs = [queue(world, world.ws, template, 2, minutes_ago=3 - n) for n in range(3)]
    assert admission.admit(world.org.pk) == jobs[:2]
    assert [flavor_of(job) for job in jobs[:2]] == ["h100", "a100"]
    assert (
        "this host's gpu capacity 5"
        in admission.explain(Job.objects.get(pk=jobs[2]))["waiting_for"]
    )


def test_workspace_limit_per_flavor(world, typed_host):
    template = gpu_template(world.ws)
    policy(world)
    WorkspaceQuota.objects.create(workspace=world.ws, gpu_flavors={"h100": {"limit": 1}})
    one = queue(world, world.ws, template, 1, "h100", minutes_ago=3)
    two = queue(world, world.ws, template, 1, "h100", minutes_ago=2)
    falls_back = queue(world, world.ws, template, 1, ["h100", "a100"], minutes_ago=1)
    assert admission.admit(world.org.pk) == [one, falls_back]
    assert flavor_of(falls_back) == "a100"
    assert admission.explain(Job.objects.get(pk=two))["waiting_for"] == (
        "workspace GPU flavor h100 limit 1: 1 reserved, this job needs 1"
    )


def test_org_capacity_per_flavor_keeps_other_workspaces_guarantees(world, typed_host):
    lab = ws_services.workspace_create(actor=SYSTEM, organization=world.org, slug="lab")
    ml_template, lab_template = gpu_template(world.ws), gpu_template(lab)
    policy(world, gpu_flavors={"h100": 2})
    WorkspaceQuota.objects.create(workspace=lab, gpu_flavors={"h100": {"guaranteed": 1}})
    big = queue(world, world.ws, ml_template, 2, "h100", minutes_ago=3)
    small = queue(world, world.ws, ml_template, 1, "h100", minutes_ago=2)
    assert admission.admit(world.org.pk) == [small]  # lab's guaranteed h100 is kept for it
    assert admission.explain(Job.objects.get(pk=big))["waiting_for"] == (
        "organisation GPU flavor h100 capacity 2: 1 reserved and 1 kept for guarantees that "
        "are not lent, this job needs 2"
    )
    third = queue(world, world.ws, ml_template, 1, "h100", minutes_ago=1)
    theirs = queue(world, lab, lab_template, 1, "h100")
    assert admission.admit(world.org.pk) == [theirs]  # ml's third would take lab's guarantee
    assert Job.objects.get(pk=third).state == "queued"
    assert held_by_flavor() == {"h100": 2}


def test_usage_per_flavor(world, typed_host):
    template = gpu_template(world.ws)
    policy(world)
    WorkspaceQuota.objects.create(
        workspace=world.ws,
        gpu_flavors={
            "h100": {"guaranteed": 1, "limit": 2},
            "l4": {"gpu_hours_per_month": 40},  # a budget for a flavor it has not used yet
        },
    )
    h100 = queue(world, world.ws, template, 2, "h100", minutes_ago=2)
    a100 = queue(world, world.ws, template, 1, "a100", minutes_ago=1)
    admission.admit(world.org.pk)
    hour_ago = timezone.now() - dt.timedelta(hours=1)
    JobAttempt.objects.filter(job_id__in=[h100, a100]).update(running_at=hour_ago)
    usage = world.client("viewer").get(USAGE).json()
    flavors = usage["gpu_flavors"]
    assert set(flavors) == {"h100", "a100", "l4"}
    assert flavors["h100"]["reserved"] == 2 and flavors["a100"]["reserved"] == 1
    assert flavors["h100"]["guaranteed"] == 1 and flavors["h100"]["limit"] == 2
    assert flavors["a100"]["limit"] is None
    assert flavors["h100"]["gpu_hours_this_month"] == pytest.approx(2.0, abs=0.01)
    assert flavors["a100"]["gpu_hours_this_month"] == pytest.approx(1.0, abs=0.01)
    assert usage["gpu_hours_this_month"] == pytest.approx(3.0, abs=0.02)

    snapshot_refresh()
    found = samples(scrape())
    tenant = {"organization": "acme", "workspace": "ml"}
    assert value(found, "manta_gpu_flavor_reserved", **tenant, flavor="h100") == 2
    assert value(found, "manta_gpu_flavor_reserved", **tenant, flavor="a100") == 1
    used = value(found, "manta_gpu_flavor_hours_used", **tenant, flavor="h100")
    assert used == pytest.approx(2.0, abs=0.01)
    assert value(found, "manta_gpu_flavor_reserved", **tenant, flavor="") is None
    assert value(found, "manta_gpu_flavor_hours_budget", **tenant, flavor="l4") == 40
    assert value(found, "manta_gpu_flavor_hours_used", **tenant, flavor="l4") == 0
    assert value(found, "manta_gpu_flavor_hours_budget", **tenant, flavor="h100") is None


def submit_api(world, template, body):
    return world.client("developer").post(
        JOBS, {"template": template.pk, "overrides": body}, format="json"
    )


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        (overrides(1, "l4"), "gpu_flavor", "this host has no GPU flavor l4"),
        (overrides(3, "h100"), "gpu_flavor", "GPU flavor h100 capacity is 2, this job needs 3"),
        (overrides(3), "requested.gpu", "GPU flavor a100 capacity is 2, this job needs 3"),
        (overrides(1, "H100"), "gpu_flavor", "lowercase"),
        (overrides(1, "gpu"), "gpu_flavor", "not 'gpu' or 'any'"),
        (overrides(1, []), "gpu_flavor", "must be a GPU flavor or a list"),
        (overrides(1, ["h100", "h100"]), "gpu_flavor", "each flavor at most once"),
        (overrides(1, {"h100": 1}), "gpu_flavor", "must be a GPU flavor or a list"),
        (overrides(0, "h100"), "gpu_flavor", "the job asks for no GPUs"),
    ],
)
def test_a_flavor_that_can_never_fit_or_is_malformed_is_refused_naming_the_field(
    world, typed_host, body, field, says
):
    response = submit_api(world, gpu_template(world.ws), body)
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    named = [key for key in errors if key.endswith(field)]
    assert named and says in errors[named[0]][0], errors
    assert not Job.objects.exists()


def test_a_flavor_is_accepted_when_another_it_accepts_can_fit(world, typed_host):
    response = submit_api(world, gpu_template(world.ws), overrides(1, ["l4", "a100"]))
    assert response.status_code == 201, response.content
    admission.admit(world.org.pk)
    assert flavor_of(response.json()["id"]) == "a100"


def test_a_queued_job_whose_flavor_quota_shrank_says_it_can_never_fit(world, typed_host):
    template = gpu_template(world.ws)
    job = queue(world, world.ws, template, 2, "h100")
    WorkspaceQuota.objects.create(workspace=world.ws, gpu_flavors={"h100": {"limit": 1}})
    assert admission.admit(world.org.pk) == []
    assert admission.explain(Job.objects.get(pk=job))["waiting_for"] == (
        "the workspace's GPU flavor h100 limit is 1, this job needs 2, so it can never fit"
    )


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        (ORG_Q, {"gpu_flavors": {"H100": 8}}, "gpu_flavors.H100"),
        (ORG_Q, {"gpu_flavors": {"h100": -1}}, "gpu_flavors.h100"),
        (ORG_Q, {"gpu_flavors": ["h100"]}, "gpu_flavors"),
        (WS_Q, {"gpu_flavors": {"h100": {"guaranteed": 3, "limit": 2}}}, "gpu_flavors.h100"),
        (WS_Q, {"gpu_flavors": {"h100": {"limits": 2}}}, "gpu_flavors.h100"),
        (WS_Q, {"gpu_flavors": {"h100": {"limit": "two"}}}, "gpu_flavors.h100.limit"),
        (WS_Q, {"gpu_flavors": {"h100": {"limit": 9}}}, "gpu_flavors.h100.limit"),
        (WS_Q, {"gpu_flavors": {"h100": {"guaranteed": 9}}}, "gpu_flavors.h100.guaranteed"),
    ],
)
def test_flavor_quotas_are_validated_strictly(world, url, body, field):
    world.client("owner").patch(ORG_Q, {"gpu_flavors": {"h100": 8}}, format="json")
    response = world.client("owner").patch(url, body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert any(key.startswith(field) for key in errors), errors


def test_flavor_quotas_round_trip_and_shrinking_capacity_below_guarantees_is_refused(world):
    client = world.client("owner")
    assert client.patch(ORG_Q, {"gpu_flavors": {"h100": 8}}, format="json").status_code == 200
    response = client.patch(WS_Q, {"gpu_flavors": {"h100": {"guaranteed": 4}}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["gpu_flavors"] == {
        "h100": {
            "guaranteed": 4.0,
            "limit": None,
            "lending_limit": None,
            "gpu_hours_per_month": None,
        }
    }
    shrink = client.patch(ORG_Q, {"gpu_flavors": {"h100": 2}}, format="json")
    assert shrink.status_code == 400
    assert "gpu_flavors.h100.guaranteed" in shrink.json()["errors"], shrink.json()
    assert OrgQuota.objects.get().gpu_flavors == {"h100": 8}


@pytest.mark.parametrize("grouped", [False, True])
def test_an_overdue_job_owed_a_flavor_holds_back_only_that_flavor(world, typed_host, grouped):
    """fair_share, two h100 and two a100 on the host. ml is guaranteed both h100 and its
    2-h100 job has waited past balanced_max_wait_seconds while other borrows one h100. other's
    next h100 job would take the last free h100 and keep ml waiting: it is held back. third's
    a100 job needs nothing ml waits for: it starts (holding back every resource would have kept
    it waiting too). The same under a quota group (the Fair Tree's pass)."""
    other = WorkspaceFactory(organization=world.org, slug="other")
    third = WorkspaceFactory(organization=world.org, slug="third")
    group = QuotaGroup.objects.create(organization=world.org, name="all") if grouped else None
    WorkspaceQuota.objects.create(
        workspace=world.ws, group=group, gpu_flavors={"h100": {"guaranteed": 2}}
    )
    for ws in (other, third):
        WorkspaceQuota.objects.create(workspace=ws, group=group)
    policy(world, "fair_share", balanced_max_wait_seconds=600)
    templates = {ws.slug: gpu_template(ws) for ws in (world.ws, other, third)}
    borrowed = queue(world, other, templates["other"], 1, "h100", minutes_ago=60)
    assert admission.admit(world.org.pk) == [borrowed]

    owed = queue(world, world.ws, templates["ml"], 2, "h100", minutes_ago=30)
    would_take = queue(world, other, templates["other"], 1, "h100", minutes_ago=1)
    elsewhere = queue(world, third, templates["third"], 1, "a100", minutes_ago=1)
    assert admission.admit(world.org.pk) == [elsewhere]
    assert flavor_of(elsewhere) == "a100"
    assert set(Job.objects.filter(pk__in=[owed, would_take]).values_list("state", flat=True)) == {
        "queued"
    }
    assert admission.explain(Job.objects.get(pk=would_take))["waiting_for"] == (
        f"GPU flavor h100 held back for job {owed}, which has waited more than "
        "balanced_max_wait_seconds for capacity within its workspace's guarantee"
    )
