"""The quota tree through the API and real admission passes on PostgreSQL: an organisation of 8
GPUs, a division ``vision`` (guaranteed 6, limit 6) with teams ``team-a`` (guaranteed 4: ml
and a2, 2 each) and ``team-b`` (guaranteed 2: b1, 2), and ``ops`` directly under the
organisation (guaranteed 2)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from audit.context import Actor
from audit.models import AuditEvent
from config.errors import InvalidInput
from jobs import accounting, admission
from jobs.metrics_snapshot import snapshot_refresh
from jobs.models import Job
from jobs.prediction import predict_start
from quotas import services
from quotas.models import OrgQuota, QuotaGroup, Reservation, WorkspaceQuota
from tests.factories import QuotaGroupFactory, WorkspaceFactory
from tests.quotas.test_admission import bare_template, queue_job, setup_quota

API = "/api/v1/orgs/acme/"
GROUPS = API + "quota-groups/"


def ws_quota(ws, group, gpu):
    WorkspaceQuota.objects.update_or_create(
        workspace=ws, defaults={"group": group, "guaranteed_gpu": gpu}
    )


@pytest.fixture
def tree(world):
    """The tree of the module docstring, built through the services (so it is a consistent
    one); returns (world, workspaces by slug, templates by slug, groups by name)."""
    setup_quota(world, 8, "round_robin", preemption=True)
    owner = Actor.for_user(world.users["owner"])

    def group(name, parent=None, **quota):
        data = {"name": name, "parent": parent, **quota}
        return services.quota_group_create(actor=owner, organization=world.org, data=data)

    vision = group("vision", guaranteed_gpu=6, limit_gpu=6)
    groups = {
        "vision": vision,
        "team-a": group("team-a", vision, guaranteed_gpu=4),
        "team-b": group("team-b", vision, guaranteed_gpu=2),
    }
    spaces = {"ml": world.ws}
    for slug in ("a2", "b1", "ops"):
        spaces[slug] = WorkspaceFactory(organization=world.org, slug=slug)
    for slug, group_name in (("ml", "team-a"), ("a2", "team-a"), ("b1", "team-b")):
        ws_quota(spaces[slug], groups[group_name], 2)
    ws_quota(spaces["ops"], None, 2)
    templates = {slug: bare_template(ws) for slug, ws in spaces.items()}
    return world, spaces, templates, groups


def run(world, spaces, templates, slug, gpu, minutes_ago=30):
    job_id = queue_job(world, spaces[slug], templates[slug], gpu, minutes_ago=minutes_ago)
    assert job_id in admission.admit(world.org.pk)
    return job_id


def state(job_id):
    return Job.objects.get(pk=job_id).state


def test_a_group_limit_binds_and_why_waiting_names_the_group(tree):
    world, spaces, templates, _ = tree
    run(world, spaces, templates, "ml", 2)
    run(world, spaces, templates, "ml", 2)  # ml borrows a2's idle guarantee within team-a
    run(world, spaces, templates, "b1", 2)
    waiting = queue_job(world, spaces["a2"], templates["a2"], 1, minutes_ago=5)
    ops_job = queue_job(world, spaces["ops"], templates["ops"], 2, minutes_ago=1)
    # with preemption off, nothing gives a2 its guarantee back: vision is at its limit
    OrgQuota.objects.filter(organization=world.org).update(preemption=False)
    assert admission.admit(world.org.pk) == [ops_job]  # ops is not under vision
    job = Job.objects.get(pk=waiting)
    assert admission.explain(job)["waiting_for"] == (
        "group 'vision' gpu limit 6: 6 reserved, this job needs 1"
    )
    tree_read = world.client("member").get(API + "quota/tree/").json()
    vision = next(node for node in tree_read["children"] if node["name"] == "vision")
    team_a = next(node for node in vision["children"] if node["name"] == "team-a")
    ml = next(node for node in team_a["children"] if node["name"] == "ml")
    assert (vision["usage"]["gpu"], vision["borrowed"]["gpu"], vision["limit"]["gpu"]) == (6, 0, 6)
    assert (ml["usage"]["gpu"], ml["borrowed"]["gpu"], ml["running"]) == (4, 2, 2)
    assert tree_read["usage"]["gpu"] == 8 and tree_read["level"] == "organization"


def test_preemption_gives_a_guarantee_back_from_the_sibling_that_borrows_it(tree):
    world, spaces, templates, _ = tree
    first = run(world, spaces, templates, "ml", 2, minutes_ago=30)
    newest = run(world, spaces, templates, "ml", 2, minutes_ago=20)
    b1 = run(world, spaces, templates, "b1", 2, minutes_ago=10)
    ops = run(world, spaces, templates, "ops", 2, minutes_ago=5)
    claim = queue_job(world, spaces["a2"], templates["a2"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == [claim]
    # ml's newest job goes (ml borrows a2's guarantee); b1 and ops are within theirs
    assert (state(newest), state(first), state(b1), state(ops)) == (
        "queued",
        "launching",
        "launching",
        "launching",
    )


def test_preemption_across_divisions_takes_from_the_borrowing_subtree_only(tree):
    world, spaces, templates, _ = tree
    # ops borrows vision's idle guarantee: 6 of 8 while vision holds 2
    run(world, spaces, templates, "b1", 2, minutes_ago=40)
    borrowed = [run(world, spaces, templates, "ops", 2, minutes_ago=30 - i) for i in range(3)]
    claim = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == [claim]
    assert [state(job) for job in borrowed] == ["launching", "launching", "queued"]


def test_a_lending_limit_keeps_its_part_for_its_subtree(tree):
    world, spaces, templates, groups = tree
    owner = Actor.for_user(world.users["owner"])
    # team-b lends nothing of its 2: ops may borrow only 8 - 2 - 2 (ml's) = 4... of vision's
    services.quota_group_update(actor=owner, group=groups["team-b"], data={"lending_limit_gpu": 0})
    OrgQuota.objects.filter(organization=world.org).update(preemption=False)
    run(world, spaces, templates, "ml", 2)
    for _ in range(2):
        run(world, spaces, templates, "ops", 2)
    blocked = queue_job(world, spaces["ops"], templates["ops"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == []
    assert admission.explain(Job.objects.get(pk=blocked))["waiting_for"] == (
        "organisation gpu capacity 8: 6 reserved and 2 kept for guarantees that are not lent, "
        "this job needs 2"
    )
    assert state(blocked) == "queued"
    mine = queue_job(world, spaces["b1"], templates["b1"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == [mine]


# --- the API -------------------------------------------------------------------------------


def test_groups_are_created_updated_and_deleted_by_org_admins(world):
    client = world.client("org_admin")
    client.patch(API + "quota/", {"gpu": 8}, format="json")
    created = client.post(GROUPS, {"name": "vision", "guaranteed_gpu": 4, "limit_gpu": 6},
                          format="json")  # fmt: skip
    assert created.status_code == 201, created.content
    body = {"name": "team-a", "parent": "vision", "guaranteed_gpu": 2, "lending_limit_gpu": 1,
            "fair_share_weight": 2}  # fmt: skip
    team = client.post(GROUPS, body, format="json")
    assert team.status_code == 201, team.content
    assert team.json()["parent"] == "vision" and team.json()["lending_limit_gpu"] == 1
    moved = client.patch(API + "workspaces/ml/quota/", {"group": "team-a", "guaranteed_gpu": 1},
                         format="json")  # fmt: skip
    assert moved.status_code == 200 and moved.json()["group"] == "team-a"
    assert WorkspaceQuota.objects.get(workspace=world.ws).group.name == "team-a"
    changed = client.patch(GROUPS + "team-a/", {"limit_gpu": 5}, format="json")
    assert changed.status_code == 200 and changed.json()["limit_gpu"] == 5
    assert client.get(GROUPS).json()["results"][0]["name"] == "team-a"
    assert world.client("member").get(GROUPS + "vision/").json()["guaranteed_gpu"] == 4
    # a group with anything under it stays: 409, not a silent re-parenting
    refused = client.delete(GROUPS + "vision/")
    assert refused.status_code == 409 and QuotaGroup.objects.filter(name="vision").exists()
    assert "1 group(s)" in refused.json()["detail"]
    client.patch(API + "workspaces/ml/quota/", {"group": None}, format="json")
    assert client.delete(GROUPS + "team-a/").status_code == 204
    assert client.delete(GROUPS + "vision/").status_code == 204
    actions = list(
        AuditEvent.objects.filter(action__startswith="quota_group").values_list("action", flat=True)
    )
    assert (
        actions == ["quota_group.create"] * 2 + ["quota_group.update"] + ["quota_group.delete"] * 2
    )


@pytest.fixture
def groups(world):
    client = world.client("owner")
    client.patch(API + "quota/", {"gpu": 8}, format="json")
    for body in (
        {"name": "vision", "guaranteed_gpu": 4, "limit_gpu": 6},
        {"name": "team-a", "parent": "vision", "guaranteed_gpu": 2, "limit_gpu": 4},
        {"name": "team-x", "parent": "team-a", "guaranteed_gpu": 1},
    ):
        assert client.post(GROUPS, body, format="json").status_code == 201
    QuotaGroupFactory(organization=world.other_org, name="theirs")
    return client


@pytest.mark.parametrize(
    ("method", "url", "body", "field"),
    [
        ("patch", "vision/", {"parent": "team-x"}, "parent"),  # a cycle through two levels
        ("patch", "vision/", {"parent": "vision"}, "parent"),  # its own parent
        ("post", "", {"name": "x", "parent": "theirs"}, "parent"),  # another org's group
        ("post", "", {"name": "x", "parent": "nope"}, "parent"),
        ("post", "", {"name": "x", "guaranteed_gpu": -1}, "guaranteed_gpu"),
        ("post", "", {"name": "x", "limit_cpu": -2}, "limit_cpu"),
        ("post", "", {"name": "x", "lending_limit_gpu": -1}, "lending_limit_gpu"),
        ("post", "", {"name": "vision"}, "name"),  # taken
        ("post", "", {"name": "not a slug"}, "name"),
        ("post", "", {"name": "x", "fair_share_weight": 0}, "fair_share_weight"),
        ("patch", "team-a/", {"lending_limit_gpu": 3}, "lending_limit_gpu"),  # > guarantee 2
        ("patch", "team-a/", {"guaranteed_gpu": 5}, "guaranteed_gpu"),  # > vision's 4
        ("patch", "team-a/", {"limit_gpu": 7}, "limit_gpu"),  # > vision's limit 6
        ("patch", "team-x/", {"guaranteed_gpu": 3}, "guaranteed_gpu"),  # > team-a's 2
        ("patch", "vision/", {"guaranteed_gpu": 9}, "guaranteed_gpu"),  # > capacity 8
        ("patch", "vision/", {"max_running_jobs": -1}, "max_running_jobs"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(
    world, groups, method, url, body, field
):
    before = list(QuotaGroup.objects.order_by("pk").values())
    audited = AuditEvent.objects.count()
    response = getattr(groups, method)(GROUPS + url, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert list(QuotaGroup.objects.order_by("pk").values()) == before
    assert AuditEvent.objects.count() == audited


def test_a_workspace_quota_names_its_group_and_lending_limits(world, groups):
    url = API + "workspaces/ml/quota/"
    for body, field in (
        ({"group": "theirs"}, "group"),
        ({"group": "team-x", "guaranteed_gpu": 2}, "guaranteed_gpu"),  # > team-x's 1
        ({"guaranteed_gpu": 1, "lending_limit_gpu": 2}, "lending_limit_gpu"),
        ({"group": "team-a", "limit_gpu": 5}, "limit_gpu"),  # > team-a's limit 4
    ):
        response = groups.patch(url, body, format="json")
        assert response.status_code == 400 and field in response.json()["errors"], body
    assert not WorkspaceQuota.objects.filter(workspace=world.ws, group__isnull=False).exists()
    ok = groups.patch(url, {"group": "team-x", "guaranteed_gpu": 1, "lending_limit_gpu": 0},
                      format="json")  # fmt: skip
    assert ok.status_code == 200, ok.content
    assert (ok.json()["group"], ok.json()["lending_limit_gpu"]) == ("team-x", 0)


def test_the_service_refuses_a_parent_of_another_organisation(world):
    theirs = QuotaGroupFactory(organization=world.other_org, name="theirs")
    with pytest.raises(InvalidInput) as refused:
        services.quota_group_create(
            actor=Actor.for_user(world.users["owner"]),
            organization=world.org,
            data={"name": "mine", "parent": theirs},
        )
    assert "parent" in refused.value.errors
    assert not QuotaGroup.objects.filter(organization=world.org).exists()


def test_no_reservation_beyond_any_node_of_the_tree(tree):
    """The invariant the concurrency test checks on PostgreSQL, in one pass: a queue far larger
    than the tree admits exactly what every node's limit allows."""
    world, spaces, templates, _ = tree
    OrgQuota.objects.filter(organization=world.org).update(preemption=False)
    for slug in ("ml", "a2", "b1", "ops"):
        for _ in range(4):
            queue_job(world, spaces[slug], templates[slug], 1, minutes_ago=10)
    admission.admit(world.org.pk)
    held = {
        slug: sum(
            Reservation.objects.filter(workspace=ws, released_at__isnull=True).values_list(
                "gpu", flat=True
            )
        )
        for slug, ws in spaces.items()
    }
    assert held["ml"] + held["a2"] + held["b1"] <= 6 and sum(held.values()) == 8


def test_metrics_and_drift_cover_the_groups(tree):
    world, spaces, templates, _ = tree

    OrgQuota.objects.filter(organization=world.org).update(preemption=False)
    run(world, spaces, templates, "ml", 4)
    run(world, spaces, templates, "b1", 2)
    queue_job(world, spaces["a2"], templates["a2"], 1, minutes_ago=1)
    assert accounting.reconcile()["over_limit"] == 0
    # Behind admission's back: a reservation that takes vision past its limit 6 (b1 is within
    # its own, and the organisation within its capacity).
    extra = queue_job(world, spaces["b1"], templates["b1"], 1, minutes_ago=1)
    Reservation.objects.create(
        job_id=extra, organization=world.org, workspace=spaces["b1"], cpu=0, memory_gb=0, gpu=1
    )
    drift = accounting.reconcile()
    assert drift["over_limit"] == 1 and drift["over_capacity"] == 0
    snapshot_refresh(drift=drift)
    text = APIClient().get("/metrics").content.decode()
    labels = 'group="vision",organization="acme",resource="gpu"'
    assert f"manta_quota_group_reserved{{{labels}}} 7.0" in text
    assert f"manta_quota_group_limit{{{labels}}} 6.0" in text
    assert f"manta_quota_group_guaranteed{{{labels}}} 6.0" in text
    team = 'group="team-a",organization="acme",resource="gpu"'
    assert f"manta_quota_group_reserved{{{team}}} 4.0" in text
    pending = 'organization="acme",reason="group_limit",workspace="a2"'
    assert f"manta_pending_jobs{{{pending}}} 1.0" in text


def test_fair_share_under_groups_compares_siblings_at_the_highest_level_first(tree):
    """Fair Tree: vision (2 of 6 held) goes before ops (1 of 2); within it team-b (idle) before
    team-a (2 of 4), though ml's own share (0) is the lowest of all and its job the oldest. A flat
    fair share would have taken ml's job first."""
    world, spaces, templates, _ = tree
    OrgQuota.objects.filter(organization=world.org).update(preemption=False)
    run(world, spaces, templates, "a2", 2)
    run(world, spaces, templates, "ops", 1)
    OrgQuota.objects.filter(organization=world.org).update(policy="fair_share")
    jobs = {
        slug: queue_job(world, spaces[slug], templates[slug], 1, minutes_ago=age)
        for slug, age in (("ml", 30), ("b1", 20), ("ops", 10))
    }
    assert admission.admit(world.org.pk) == [jobs["b1"], jobs["ops"], jobs["ml"]]
    waiting = queue_job(world, spaces["ml"], templates["ml"], 3, minutes_ago=1)
    factors = admission.explain(Job.objects.get(pk=waiting))["factors"]
    assert [node["group"] for node in factors["path"]] == ["vision", "team-a"]
    assert factors["path"][0]["current_share"] == pytest.approx(4 / 6, abs=1e-6)
    assert factors["path"][1]["current_share"] == pytest.approx(3 / 4, abs=1e-6)


def test_a_job_over_a_group_limit_is_refused_at_submission(tree):
    world, _, templates, _ = tree
    url = API + "workspaces/ml/jobs/"
    template = templates["ml"]
    groups = [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": 7}]
    before = Job.objects.count()
    response = world.client("developer").post(
        url, {"template": template.pk, "overrides": {"worker_groups": groups}}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["requested.gpu"] == [
        "this job needs 7 gpu; quota group 'vision''s limit is 6, so it could never run"
    ]
    assert Job.objects.count() == before


@pytest.mark.parametrize("policy", ["fair_share", "round_robin"])
def test_a_predicted_start_replays_the_tree(tree, policy):
    """The prediction replays admission on a copy of the ledger, groups and all: a job behind
    vision's limit waits for a job of vision to end, not for any job of the organisation."""
    world, spaces, templates, _ = tree
    OrgQuota.objects.filter(organization=world.org).update(preemption=False, policy=policy)
    run(world, spaces, templates, "ml", 4)
    run(world, spaces, templates, "b1", 2)
    run(world, spaces, templates, "ops", 1)
    job = Job.objects.get(pk=queue_job(world, spaces["a2"], templates["a2"], 2, minutes_ago=1))
    predicted = predict_start(job)
    assert (predicted.position, predicted.blocker) == (1, "group_limit")
    assert predicted.p50 is not None and predicted.p50 <= predicted.p90


def test_an_overdue_owed_job_holds_back_only_under_the_group_it_is_short_at(tree):
    """fair_share's holding back, in the tree: a2's job, within its guarantee and waiting past
    balanced_max_wait_seconds, is short at vision's limit; ml's smaller job, which would fit
    under vision, waits behind it, while ops (elsewhere in the tree) still starts."""
    world, spaces, templates, _ = tree
    OrgQuota.objects.filter(organization=world.org).update(preemption=False)
    run(world, spaces, templates, "ml", 3)
    run(world, spaces, templates, "b1", 2)
    OrgQuota.objects.filter(organization=world.org).update(
        policy="fair_share", balanced_max_wait_seconds=60
    )
    owed = queue_job(world, spaces["a2"], templates["a2"], 2, minutes_ago=30)
    small = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=20)
    elsewhere = queue_job(world, spaces["ops"], templates["ops"], 1, minutes_ago=10)
    assert admission.admit(world.org.pk) == [elsewhere]
    assert state(owed) == state(small) == "queued"
    # not yet overdue: nothing is held back, and the small job fills vision
    OrgQuota.objects.filter(organization=world.org).update(balanced_max_wait_seconds=3600)
    assert admission.admit(world.org.pk) == [small]


def test_a_put_that_does_not_name_the_group_keeps_the_workspace_in_it(world, groups):
    url = API + "workspaces/ml/quota/"
    placed = groups.patch(url, {"group": "team-x", "lending_limit_gpu": 0}, format="json")
    assert placed.status_code == 200, placed.content
    full = {**{f"guaranteed_{r}": 0 for r in ("cpu", "memory_gb", "gpu", "disk_gb")},
            **{f"limit_{r}": None for r in ("cpu", "memory_gb", "gpu", "disk_gb")},
            "max_running_jobs": None, "max_queued_jobs": None, "gpu_hours_per_month": None,
            "budget_action": "refuse", "fair_share_weight": 1}  # fmt: skip
    response = groups.put(url, full, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["group"], response.json()["lending_limit_gpu"]) == ("team-x", 0)
    moved = groups.put(url, {**full, "group": None, "lending_limit_gpu": None}, format="json")
    assert (moved.json()["group"], moved.json()["lending_limit_gpu"]) == (None, None)
