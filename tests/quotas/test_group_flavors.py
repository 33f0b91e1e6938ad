"""GPU flavors on quota groups and per-flavor GPU-hour budgets, through the API and real
admission passes on PostgreSQL, on a host whose inventory is typed (h100: devices 0-7, a100:
8-11). The organisation has 8 h100 and 4 a100 (12 GPUs):

    acme (gpu 12; h100 8, a100 4)
    ├── vision   gpu guaranteed 6; h100 guaranteed 4, limit 6
    │   ├── team-a  gpu guaranteed 4; h100 guaranteed 2, limit 3   ml, a2
    │   └── team-b  gpu guaranteed 2; h100 guaranteed 2            b1
    └── infra    gpu guaranteed 2; h100 guaranteed 2               ops
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from audit.context import Actor
from audit.models import AuditEvent
from jobs import accounting, admission, local_host
from jobs import services as job_services
from jobs.models import Job, JobAttempt
from outbox.models import DomainEvent
from quotas import services
from quotas.models import OrgQuota, QuotaGroup, Reservation, WorkspaceQuota
from tests.factories import WorkspaceFactory
from tests.quotas.test_flavors import gpu_template

API = "/api/v1/orgs/acme/"
GROUPS = API + "quota-groups/"


def typed_inventory(settings):
    settings.MANTA_LOCAL_GPUS = tuple(str(i) for i in range(12))
    settings.MANTA_LOCAL_GPU_FLAVORS = {
        **{str(i): "h100" for i in range(8)},
        **{str(i): "a100" for i in range(8, 12)},
    }
    # The GPUs are what binds here, not this machine's few CPUs, its memory or its disk.
    settings.MANTA_LOCAL_CAPACITY = {"cpu": 1e6, "memory_gb": 1e6, "disk_gb": 1e6}
    local_host.gpu_inventory.cache_clear()


@pytest.fixture
def typed_host(settings):
    typed_inventory(settings)
    yield
    local_host.gpu_inventory.cache_clear()


def overrides(gpu, flavor, **more):
    body = {"worker_groups": [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": gpu}]}
    return {**body, "gpu_flavor": flavor, **more}


@pytest.fixture
def tree(world, typed_host):
    """The tree of the module docstring, built through the services; returns (world,
    workspaces and templates by slug, groups by name)."""
    OrgQuota.objects.update_or_create(
        organization=world.org,
        defaults={"gpu": 12, "gpu_flavors": {"h100": 8, "a100": 4}, "policy": "round_robin"},
    )
    owner = Actor.for_user(world.users["owner"])

    def group(name, parent=None, gpu=0, **h100):
        data = {"name": name, "parent": parent, "guaranteed_gpu": gpu}
        data["gpu_flavors"] = {"h100": {"guaranteed": 0, "limit": None, **h100}}
        return services.quota_group_create(actor=owner, organization=world.org, data=data)

    vision = group("vision", gpu=6, guaranteed=4, limit=6)
    groups = {
        "vision": vision,
        "team-a": group("team-a", vision, gpu=4, guaranteed=2, limit=3),
        "team-b": group("team-b", vision, gpu=2, guaranteed=2),
        "infra": group("infra", gpu=2, guaranteed=2),
    }
    spaces = {"ml": world.ws}
    for slug in ("a2", "b1", "ops"):
        spaces[slug] = WorkspaceFactory(organization=world.org, slug=slug)
    placed = {"ml": "team-a", "a2": "team-a", "b1": "team-b", "ops": "infra"}
    for slug, group_name in placed.items():
        WorkspaceQuota.objects.update_or_create(
            workspace=spaces[slug], defaults={"group": groups[group_name], "guaranteed_gpu": 2}
        )
    templates = {slug: gpu_template(ws) for slug, ws in spaces.items()}
    return world, spaces, templates, groups


def queue(world, ws, template, gpu, flavor, *, minutes_ago=10, **more):
    job = job_services.job_submit(
        actor=Actor.for_user(world.users["owner"]),
        workspace=ws,
        template=template,
        overrides=overrides(gpu, flavor, **more),
    )
    Job.objects.filter(pk=job.pk).update(
        queued_at=timezone.now() - dt.timedelta(minutes=minutes_ago)
    )
    return job.pk


def state(job_id):
    return Job.objects.get(pk=job_id).state


def node(tree_read, *names):
    found = tree_read
    for name in names:
        found = next(child for child in found["children"] if child["name"] == name)
    return found


def test_a_groups_h100_limit_binds_the_workspaces_below_it(tree):
    world, spaces, templates, _ = tree
    ml, a2 = (spaces[s] for s in ("ml", "a2"))
    first = [queue(world, ml, templates["ml"], 1, "h100", minutes_ago=30 - i) for i in range(2)]
    third = queue(world, a2, templates["a2"], 1, "h100", minutes_ago=20)
    waiting = queue(world, a2, templates["a2"], 1, "h100", minutes_ago=15)
    a100 = queue(world, ml, templates["ml"], 2, "a100", minutes_ago=10)
    assert admission.admit(world.org.pk) == [*first, third, a100]
    assert admission.explain(Job.objects.get(pk=waiting))["waiting_for"] == (
        "group 'team-a' GPU flavor h100 limit 3: 3 reserved, this job needs 1"
    )
    # b1, elsewhere under vision, still gets h100.
    b1 = queue(world, spaces["b1"], templates["b1"], 2, "h100", minutes_ago=1)
    assert admission.admit(world.org.pk) == [b1]

    read = world.client("member").get(API + "quota/tree/").json()
    assert read["gpu_flavors"]["h100"] == {
        "guaranteed": 8, "limit": 8, "lending_limit": None, "usage": 5, "borrowed": 0.0
    }  # fmt: skip
    assert node(read, "vision", "team-a")["gpu_flavors"]["h100"] == {
        "guaranteed": 2.0, "limit": 3, "lending_limit": None, "usage": 3.0, "borrowed": 1.0
    }  # fmt: skip
    assert node(read, "vision", "team-a")["gpu_flavors"]["a100"]["usage"] == 2
    assert node(read, "vision")["gpu_flavors"]["h100"]["usage"] == 5
    ml_node = node(read, "vision", "team-a", "ml")["gpu_flavors"]["h100"]
    assert (ml_node["usage"], ml_node["lending_limit"]) == (2, 0.0)  # keeps what it has


def test_a_job_over_a_groups_flavor_limit_is_refused_at_submission(tree):
    world, _, templates, _ = tree
    response = world.client("developer").post(
        API + "workspaces/ml/jobs/",
        {"template": templates["ml"].pk, "overrides": overrides(4, "h100")},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["gpu_flavor"] == [
        "quota group 'team-a''s GPU flavor h100 limit is 3, this job needs 4, so it can never fit"
    ]


def test_preemption_across_groups_takes_h100_back_only_from_h100_holders(tree):
    world, spaces, templates, _ = tree
    OrgQuota.objects.filter(organization=world.org).update(preemption=True)
    # ml lends its h100 guarantee while idle; ops (under infra) borrows every h100 and two
    # a100 besides.
    WorkspaceQuota.objects.filter(workspace=spaces["ml"]).update(
        gpu_flavors={"h100": {"guaranteed": 1, "limit": None, "lending_limit": 1}}
    )
    ops, template = spaces["ops"], templates["ops"]
    h100 = [queue(world, ops, template, 2, "h100", minutes_ago=40 - i) for i in range(4)]
    a100 = queue(world, ops, template, 2, "a100", minutes_ago=30, priority=1)
    assert admission.admit(world.org.pk) == [*h100, a100]
    claim = queue(world, spaces["ml"], templates["ml"], 1, "h100", minutes_ago=1)
    assert admission.admit(world.org.pk) == [claim]
    # The a100 job goes first in preemption order (lowest priority) but would free no h100:
    # it stays; the newest h100 job of ops goes.
    assert state(a100) == "launching"
    assert [state(job) for job in h100] == ["launching"] * 3 + ["queued"]
    assert Reservation.objects.get(job_id=claim, released_at=None).gpu_flavor == "h100"


# --- per-flavor budgets ---------------------------------------------------------------------


def ran(job_id, *, gpu_hours, flavor):
    """A finished attempt of ``job_id`` (1 GPU) that ran ``gpu_hours`` on ``flavor``."""
    end = timezone.now()
    JobAttempt.objects.create(
        job_id=job_id,
        number=99,
        target_kind="local",
        target_name="local",
        cluster_name="c",
        state="succeeded",
        gpu_flavor=flavor,
        running_at=end - dt.timedelta(hours=gpu_hours),
        finished_at=end,
    )
    Job.objects.filter(pk=job_id).update(state="succeeded")


def budget(world, action, **flavors):
    WorkspaceQuota.objects.update_or_create(
        workspace=world.ws,
        defaults={
            "budget_action": action,
            "gpu_flavors": {
                name: {"guaranteed": 0, "limit": None, "gpu_hours_per_month": hours}
                for name, hours in flavors.items()
            },
        },
    )


HOUR = {"max_runtime_seconds": 3600}


def test_a_spent_h100_budget_refuses_an_h100_job_and_admits_an_a100_one(world, typed_host):
    template = gpu_template(world.ws)
    budget(world, "refuse", h100=10)
    ran(queue(world, world.ws, template, 1, "h100"), gpu_hours=9.5, flavor="h100")
    jobs = API + "workspaces/ml/jobs/"
    client = world.client("developer")
    refused = client.post(
        jobs, {"template": template.pk, "overrides": overrides(1, "h100", **HOUR)}, format="json"
    )
    assert refused.status_code == 409, refused.content
    assert refused.json()["type"] == "budget_exhausted"
    assert refused.json()["detail"] == (
        "GPU flavor h100 budget 10 h/month: 9.5 h used, this job may use up to 1 h"
    )
    assert "gpu_flavor" in refused.json()["errors"]
    # The total budget (none here) is not what stops it: a100 runs, and a job that takes
    # either is accepted and gets a100.
    for flavor in ("a100", ["h100", "a100"]):
        body = {"template": template.pk, "overrides": overrides(1, flavor, **HOUR)}
        assert client.post(jobs, body, format="json").status_code == 201
    admitted = admission.admit(world.org.pk)
    assert len(admitted) == 2
    flavors = set(
        JobAttempt.objects.filter(job_id__in=admitted).values_list("gpu_flavor", flat=True)
    )
    assert flavors == {"a100"}
    # A short job still fits the budget left.
    short = client.post(
        jobs,
        {"template": template.pk, "overrides": overrides(1, "h100", max_runtime_seconds=1800)},
        format="json",
    )
    assert short.status_code == 201, short.content


def test_a_spent_h100_budget_queues_h100_jobs_and_usage_shows_spend_against_it(world, typed_host):
    template = gpu_template(world.ws)
    budget(world, "queue", h100=10)
    ran(queue(world, world.ws, template, 1, "h100"), gpu_hours=10, flavor="h100")
    waiting = queue(world, world.ws, template, 1, "h100", minutes_ago=2, **HOUR)
    other = queue(world, world.ws, template, 1, "a100", minutes_ago=1)
    OrgQuota.objects.update_or_create(organization=world.org, defaults={"policy": "round_robin"})
    assert admission.admit(world.org.pk) == [other]
    assert admission.explain(Job.objects.get(pk=waiting))["waiting_for"] == (
        "GPU flavor h100 budget 10 h/month: 10 h used, this job may use up to 1 h; it waits "
        "for the next budget period"
    )
    usage = world.client("viewer").get(API + "workspaces/ml/usage/").json()
    h100 = usage["gpu_flavors"]["h100"]
    assert h100["gpu_hours_per_month"] == 10
    assert h100["gpu_hours_this_month"] == pytest.approx(10, abs=0.01)
    assert usage["gpu_flavors"]["a100"]["gpu_hours_per_month"] is None
    # The thresholds of the flavor's budget are announced once each, naming the flavor.
    assert accounting.budget_alerts() == 2
    assert accounting.budget_alerts() == 0
    events = DomainEvent.objects.filter(type="quota.threshold_reached").order_by("occurred_at")
    assert [(e.payload["threshold_percent"], e.payload["gpu_flavor"]) for e in events] == [
        (80, "h100"),
        (100, "h100"),
    ]
    assert events[0].payload["gpu_hours_per_month"] == 10


# --- the API --------------------------------------------------------------------------------


def flavors(h100=None, **more):
    return {"gpu_flavors": {"h100": {**(h100 or {}), **more}}}


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("quota-groups/vision/", {"gpu_flavors": {"H100": {"guaranteed": 1}}}, "gpu_flavors.H100"),
        ("quota-groups/vision/", {"gpu_flavors": {"gpu": {"guaranteed": 1}}}, "gpu_flavors.gpu"),
        ("quota-groups/vision/", flavors(guaranteed=-1), "gpu_flavors.h100.guaranteed"),
        ("quota-groups/vision/", flavors(limit=-2), "gpu_flavors.h100.limit"),
        ("quota-groups/vision/", flavors(guaranteed=4, limit=3), "gpu_flavors.h100.guaranteed"),
        ("quota-groups/infra/", flavors(guaranteed=2, lending_limit=3),
         "gpu_flavors.h100.lending_limit"),
        ("quota-groups/infra/", flavors(gpu_hours_per_month=3), "gpu_flavors.h100"),
        ("quota-groups/infra/", flavors(guaranteed="two"), "gpu_flavors.h100.guaranteed"),
        ("quota-groups/vision/", {"gpu_flavors": ["h100"]}, "gpu_flavors"),
        # a child's guarantees over its parent's
        ("quota-groups/team-a/", flavors(guaranteed=3, limit=3), "gpu_flavors.h100.guaranteed"),
        # a group's flavors over its totals (team-b is guaranteed 2 GPUs in all)
        ("quota-groups/team-b/", {"gpu_flavors": {"h100": {"guaranteed": 2},
                                                  "a100": {"guaranteed": 1}}},
         "gpu_flavors.a100.guaranteed"),
        ("quota-groups/infra/", {"limit_gpu": 3, **flavors(guaranteed=2, limit=4)},
         "gpu_flavors.h100.limit"),
        # a limit over the limit above it, or the capacity
        ("quota-groups/team-a/", flavors(guaranteed=2, limit=7), "gpu_flavors.h100.limit"),
        ("quota-groups/infra/", flavors(guaranteed=2, limit=9), "gpu_flavors.h100.limit"),
        # a workspace below: its guarantee over its group's, its limit over the group's
        ("workspaces/ml/quota/", flavors(guaranteed=3), "gpu_flavors.h100.guaranteed"),
        ("workspaces/ml/quota/", flavors(limit=4), "gpu_flavors.h100.limit"),
        ("workspaces/ml/quota/", flavors(gpu_hours_per_month=-1),
         "gpu_flavors.h100.gpu_hours_per_month"),
        ("workspaces/ml/quota/", flavors(guaranteed=1, lending_limit=2),
         "gpu_flavors.h100.lending_limit"),
        # the organisation's capacity under the groups' guarantees
        ("quota/", {"gpu_flavors": {"h100": 5}}, "gpu_flavors.h100.guaranteed"),
        # hostile values: a huge number, an unknown key, a NUL in a flavor's name
        ("quota-groups/vision/", flavors(limit=1e12), "gpu_flavors.h100.limit"),
        ("quota-groups/vision/", flavors(surprise=1), "gpu_flavors.h100"),
        ("quota-groups/vision/", {"gpu_flavors": {"h1\x0000": {"guaranteed": 1}}}, "gpu_flavors"),
        ("workspaces/ml/quota/", flavors(gpu_hours_per_month=1e300),
         "gpu_flavors.h100.gpu_hours_per_month"),
    ],
)  # fmt: skip
def test_flavor_quotas_of_the_tree_are_validated_naming_the_field(tree, url, body, field):
    world = tree[0]
    before = list(QuotaGroup.objects.order_by("pk").values())
    quotas = list(WorkspaceQuota.objects.order_by("pk").values())
    audited = AuditEvent.objects.count()
    response = world.client("owner").patch(API + url, body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors or any(key.startswith(field + ".") for key in errors), errors
    assert list(QuotaGroup.objects.order_by("pk").values()) == before
    assert list(WorkspaceQuota.objects.order_by("pk").values()) == quotas
    assert AuditEvent.objects.count() == audited


def test_group_flavors_round_trip_through_the_api(tree):
    world = tree[0]
    client = world.client("org_admin")
    body = {"name": "research", "guaranteed_gpu": 2,
            "gpu_flavors": {"a100": {"guaranteed": 2, "lending_limit": 1}}}  # fmt: skip
    created = client.post(GROUPS, body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["gpu_flavors"] == {
        "a100": {"guaranteed": 2.0, "limit": None, "lending_limit": 1.0}
    }
    changed = client.patch(GROUPS + "research/", {"gpu_flavors": {}}, format="json")
    assert changed.status_code == 200 and changed.json()["gpu_flavors"] == {}
    audited = AuditEvent.objects.filter(action="quota_group.update").latest("pk")
    assert audited.changes["gpu_flavors"][1] == {}
