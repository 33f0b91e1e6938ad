import pytest

from audit.models import AuditEvent
from jobs.models import Job
from quotas.models import OrgQuota
from tests.factories import QuotaGroupFactory
from tests.matrix import IN_ORG, ORG_ADMINS, WS_VISIBLE, Case, check_case
from tests.test_schema import load_schema

ORG_Q = "/api/v1/orgs/acme/quota/"
WS_Q = "/api/v1/orgs/acme/workspaces/ml/quota/"
JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"
WS = "/api/v1/orgs/{org}/workspaces/{ws}/"


def test_org_quota_is_managed_by_org_admins(world):
    body = {"cpu": 64, "gpu": 8, "memory_gb": 256, "max_running_jobs": 10,
            "policy": "fair_share", "preemption": True}  # fmt: skip
    assert world.client("ws_admin").patch(ORG_Q, body, format="json").status_code == 403
    response = world.client("org_admin").patch(ORG_Q, body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["policy"] == "fair_share" and response.json()["gpu"] == 8
    assert AuditEvent.objects.filter(action="quota.update").count() == 1
    assert world.client("member").get(ORG_Q).json()["gpu"] == 8


@pytest.mark.parametrize(
    "body",
    [
        {"fair_share_preemption": True},  # fifo, no preemption
        {"fair_share_preemption": True, "policy": "fair_share"},  # preemption off
        {"fair_share_preemption": True, "preemption": True, "policy": "round_robin"},
        {"fair_share_preemption": "yes please"},
        {"fair_share_preemption": None},
        {"fair_share_preemption": "true\u0000"},
        {"fair_share_preemption": {"on": True}},
    ],
)
def test_fair_share_preemption_needs_fair_share_and_preemption(world, body):
    client = world.client("owner")
    before = AuditEvent.objects.count()
    response = client.patch(ORG_Q, body, format="json")
    assert response.status_code == 400, response.content
    assert "fair_share_preemption" in response.json()["errors"], response.json()
    assert not OrgQuota.objects.filter(fair_share_preemption=True).exists()
    assert AuditEvent.objects.count() == before
    both = {"policy": "fair_share", "preemption": True, "fair_share_preemption": True}
    response = client.patch(ORG_Q, both, format="json")
    assert response.status_code == 200 and response.json()["fair_share_preemption"] is True
    # turning preemption off while fair-share preemption is on is refused too
    response = client.patch(ORG_Q, {"preemption": False}, format="json")
    assert response.status_code == 400 and "fair_share_preemption" in response.json()["errors"]
    assert OrgQuota.objects.get().preemption is True


@pytest.mark.parametrize(
    ("org", "ws", "field"),
    [
        ({"gpu": 8}, {"guaranteed_gpu": 4, "limit_gpu": 2}, "guaranteed_gpu"),
        ({"gpu": 8}, {"limit_gpu": 16}, "limit_gpu"),
        ({"gpu": 8}, {"guaranteed_gpu": 9}, "guaranteed_gpu"),
        ({}, {"limit_cpu": -1}, "limit_cpu"),
        ({}, {"budget_action": "explode"}, "budget_action"),
    ],
)
def test_workspace_quota_rules(world, org, ws, field):
    if org:
        world.client("owner").patch(ORG_Q, org, format="json")
    before = AuditEvent.objects.count()
    response = world.client("owner").patch(WS_Q, ws, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert AuditEvent.objects.count() == before


def test_sum_of_guarantees_within_capacity(world):
    client = world.client("owner")
    client.patch(ORG_Q, {"gpu": 4}, format="json")
    assert client.patch(WS_Q, {"guaranteed_gpu": 3}, format="json").status_code == 200
    client.post("/api/v1/orgs/acme/workspaces/", {"slug": "b"}, format="json")
    other = client.patch("/api/v1/orgs/acme/workspaces/b/quota/", {"guaranteed_gpu": 2},
                         format="json")  # fmt: skip
    assert other.status_code == 400 and "add up to 5" in other.json()["detail"]
    shrink = client.patch(ORG_Q, {"gpu": 2}, format="json")
    assert shrink.status_code == 400
    assert OrgQuota.objects.get().gpu == 4


def test_workspace_quota_readable_by_members_writable_by_org_admins(world):
    assert world.client("viewer").get(WS_Q).status_code == 200
    assert world.client("ws_admin").patch(WS_Q, {"limit_gpu": 1}, format="json").status_code == 403


def test_submission_that_can_never_run_is_refused(world, template):
    world.client("owner").patch(ORG_Q, {"gpu": 8}, format="json")
    world.client("owner").patch(WS_Q, {"limit_gpu": 4}, format="json")
    before = Job.objects.count()
    groups = [{"name": "g", "replicas": 3, "cpu": 1, "memory_gb": 1, "gpu": 2}]
    response = world.client("developer").post(
        JOBS, {"template": template.pk, "overrides": {"worker_groups": groups}}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["errors"]["requested.gpu"] == [
        "this job needs 6 gpu; the workspace limit is 4, so it could never run"
    ]
    assert Job.objects.count() == before


def test_queue_full_is_429(world, template):
    world.client("owner").patch(WS_Q, {"max_queued_jobs": 2}, format="json")
    client = world.client("developer")
    for _ in range(2):
        assert client.post(JOBS, {"template": template.pk}, format="json").status_code == 201
    response = client.post(JOBS, {"template": template.pk}, format="json")
    assert response.status_code == 429
    assert response.json()["type"] == "queue_full"
    assert Job.objects.count() == 2


def test_usage(world, template):
    world.client("owner").patch(WS_Q, {"guaranteed_cpu": 2, "limit_cpu": 4}, format="json")
    world.client("developer").post(JOBS, {"template": template.pk}, format="json")
    usage = world.client("viewer").get("/api/v1/orgs/acme/workspaces/ml/usage/").json()
    assert usage["reserved"] == {"cpu": 0.0, "memory_gb": 0.0, "gpu": 0.0, "disk_gb": 0.0}
    assert usage["guaranteed"]["cpu"] == 2 and usage["limit"]["cpu"] == 4
    assert usage["queued"] == 1 and usage["running"] == 0
    assert usage["gpu_hours_this_month"] == 0


def a_group(world) -> dict[str, str]:
    """A quota group of the world's organisation (and one of the same name in the other, so a
    foreign caller's 404 is not just a missing name)."""
    for org in (world.org, world.other_org):
        QuotaGroupFactory(organization=org, name="team-a")
    return {"group": "team-a"}


CASES = [
    Case("org_quota_retrieve", "GET", "/api/v1/orgs/{org}/quota/", IN_ORG, ws_scoped=False),
    Case("org_quota_update", "PATCH", "/api/v1/orgs/{org}/quota/", ORG_ADMINS, ws_scoped=False,
         body={"gpu": 4}, audit="quota.update"),
    Case("ws_quota_retrieve", "GET", WS + "quota/", WS_VISIBLE),
    Case("ws_quota_update", "PATCH", WS + "quota/", ORG_ADMINS, body={"limit_gpu": 2},
         audit="quota.update"),
    Case("ws_usage", "GET", WS + "usage/", WS_VISIBLE),
    Case("org_quota_replace", "PUT", "/api/v1/orgs/{org}/quota/", ORG_ADMINS, ws_scoped=False,
         body={"cpu": 64, "memory_gb": 256, "gpu": 4, "disk_gb": None, "max_running_jobs": None,
               "policy": "fifo", "balanced_max_wait_seconds": 600, "preemption": False},
         audit="quota.update"),
    Case("ws_quota_replace", "PUT", WS + "quota/", ORG_ADMINS,
         body={"guaranteed_cpu": 0, "guaranteed_memory_gb": 0, "guaranteed_gpu": 0,
               "guaranteed_disk_gb": 0, "limit_cpu": None, "limit_memory_gb": None,
               "limit_gpu": 2, "limit_disk_gb": None,
               "max_running_jobs": None, "max_queued_jobs": None,
               "gpu_hours_per_month": None, "budget_action": "refuse",
               "fair_share_weight": 1, "group": None, "lending_limit_cpu": None,
               "lending_limit_memory_gb": None, "lending_limit_gpu": None,
               "lending_limit_disk_gb": None},
         audit="quota.update"),
    Case("org_quota_tree", "GET", "/api/v1/orgs/{org}/quota/tree/", IN_ORG, ws_scoped=False),
    Case("quota_groups_list", "GET", "/api/v1/orgs/{org}/quota-groups/", IN_ORG,
         ws_scoped=False),
    Case("quota_groups_create", "POST", "/api/v1/orgs/{org}/quota-groups/", ORG_ADMINS, 201,
         body={"name": "vision", "limit_gpu": 4}, audit="quota_group.create", ws_scoped=False),
    Case("quota_group_retrieve", "GET", "/api/v1/orgs/{org}/quota-groups/{group}/", IN_ORG,
         ws_scoped=False, params=a_group),
    Case("quota_group_update", "PATCH", "/api/v1/orgs/{org}/quota-groups/{group}/", ORG_ADMINS,
         body={"limit_gpu": 2}, audit="quota_group.update", ws_scoped=False, params=a_group),
    Case("quota_group_delete", "DELETE", "/api/v1/orgs/{org}/quota-groups/{group}/", ORG_ADMINS,
         204, audit="quota_group.delete", ws_scoped=False, params=a_group),
]  # fmt: skip


@pytest.mark.parametrize("who", [None, "foreign", *IN_ORG], ids=lambda w: w or "anonymous")
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matrix(world, case, who):
    check_case(world, case, who)


def test_a_quota_nobody_has_set_answers_updated_at_null_as_the_schema_says(world):
    """A new organisation's quotas are the defaults, not rows: they were never updated."""
    schemas = load_schema()["components"]["schemas"]
    for url, component in ((ORG_Q, "OrgQuota"), (WS_Q, "WorkspaceQuota")):
        response = world.client("owner").get(url)
        assert response.status_code == 200 and response.json()["updated_at"] is None
        assert schemas[component]["properties"]["updated_at"]["nullable"] is True
