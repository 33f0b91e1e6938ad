from unittest import mock

import pytest
from django.db.models.sql.compiler import SQLCompiler
from rest_framework.serializers import ModelSerializer

from audit.models import AuditEvent
from jobs import selectors
from jobs.api import serializers as s
from jobs.models import Job
from outbox.models import DomainEvent
from tests.factories import JobAttemptFactory
from tests.jobs.conftest import submit

JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"


def set_policy(world, policy, thresholds=None):
    body = {"approval_policy": policy, "approval_thresholds": thresholds or {}}
    # Approval settings are the organisation's (tests/workspaces/test_governance.py).
    response = world.client("org_admin").patch(
        "/api/v1/orgs/acme/workspaces/ml/", body, format="json"
    )
    assert response.status_code == 200
    world.ws.refresh_from_db()


def test_submit_resolves_spec_and_requested_resources(world, template):
    body = {
        "template": template.pk,
        "name": "big-run",
        "overrides": {
            "priority": 8,
            "worker_groups": [
                {"name": "cpu", "replicas": 3, "cpu": 4, "memory_gb": 8},
                {"name": "gpu", "replicas": 2, "cpu": 8, "memory_gb": 32, "gpu": 2},
            ],
        },
    }
    response = world.client("developer").post(JOBS, body, format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["state"] == "queued"  # auto policy
    assert job["name"] == "big-run" and job["priority"] == 8
    # head 0 cpu / 2 GB + 3 x (4 cpu, 8 GB) + 2 x (8 cpu, 32 GB, 2 gpu), as the local host's
    # sandboxes enforce it: each node at least 1 CPU, its memory + 30 % object store + 1 GiB of
    # Ray's own, the default 10 GB of disk
    assert job["requested"] == pytest.approx(
        {
            "cpu": 1 + 3 * 4 + 2 * 8,
            "memory_gb": (2 + 0.6 + 1) + 3 * (8 + 2.4 + 1) + 2 * (32 + 9.6 + 1),
            "gpu": 4.0,
            "disk_gb": 6 * 10.0,
        }
    )
    assert job["submitted_by"] == "dev@acme.test"
    assert job["template"] == {"id": template.pk, "name": "counter"}
    types = list(
        DomainEvent.objects.filter(payload__job__id=job["id"]).values_list("type", flat=True)
    )
    assert types == ["job.submitted", "job.queued"]


def test_override_outside_allowed_is_refused_naming_the_field(world, template):
    before = Job.objects.count()
    response = world.client("developer").post(
        JOBS,
        {"template": template.pk, "overrides": {"image": "rayproject/ray:2.9.0"}},
        format="json",
    )
    assert response.status_code == 400
    assert "overrides.image" in response.json()["errors"]
    bad_value = world.client("developer").post(
        JOBS, {"template": template.pk, "overrides": {"entrypoint": "a\nb"}}, format="json"
    )
    assert bad_value.status_code == 400 and "overrides.entrypoint" in bad_value.json()["errors"]
    assert Job.objects.count() == before


def test_unknown_template_is_400(world, template):
    response = world.client("developer").post(JOBS, {"template": 999999}, format="json")
    assert response.status_code == 400 and "template" in response.json()["errors"]


@pytest.mark.parametrize(
    ("policy", "thresholds", "overrides", "state"),
    [
        ("auto", {}, {}, "queued"),
        ("always", {}, {}, "pending_approval"),
        ("threshold", {"gpu": 1}, {}, "queued"),
        (
            "threshold",
            {"gpu": 1},
            {"worker_groups": [{"name": "g", "replicas": 1, "cpu": 1, "memory_gb": 1, "gpu": 2}]},
            "pending_approval",
        ),
        ("threshold", {"cpu": 0.5}, {}, "pending_approval"),
        (
            "threshold",
            {"max_runtime_seconds": 60},
            {"max_runtime_seconds": 120},
            "pending_approval",
        ),
        ("threshold", {"memory_gb": 100}, {}, "queued"),
    ],
)
def test_approval_policy(world, template, policy, thresholds, overrides, state):
    set_policy(world, policy, thresholds)
    job = (
        world.client("developer")
        .post(JOBS, {"template": template.pk, "overrides": overrides}, format="json")
        .json()
    )
    assert job["state"] == state, job
    assert job["approval_required"] == (state == "pending_approval")
    if state == "pending_approval":
        assert job["approval_reason"]
        assert DomainEvent.objects.filter(
            type="job.approval_requested", payload__job__id=job["id"]
        ).exists()


def test_approval_flow_and_timeline(world, template):
    set_policy(world, "always")
    job = world.client("developer").post(JOBS, {"template": template.pk}, format="json").json()
    url = f"{JOBS}{job['id']}/"
    # the submitter cannot approve even as admin of the workspace
    own = world.client("ws_admin").post(JOBS, {"template": template.pk}, format="json").json()
    self_approval = world.client("ws_admin").post(f"{JOBS}{own['id']}/approve/", {}, format="json")
    assert self_approval.status_code == 403
    assert self_approval.json()["type"] == "self_approval_forbidden"
    # a developer is not an approver
    assert world.client("developer2").post(url + "approve/", {}, format="json").status_code == 403
    approved = world.client("ws_admin").post(
        url + "approve/", {"reason": "looks fine"}, format="json"
    )
    assert approved.status_code == 200, approved.content
    body = approved.json()
    assert body["state"] == "queued" and body["decided_by"] == "wsadmin@acme.test"
    timeline = world.client("viewer").get(url + "events/").json()["results"]
    assert [(e["kind"], e["from_state"], e["to_state"]) for e in timeline] == [
        ("submitted", "", "pending_approval"),
        ("approved", "pending_approval", "queued"),
    ]
    assert timeline[1]["actor"] == "wsadmin@acme.test" and timeline[1]["reason"] == "looks fine"
    audit = AuditEvent.objects.filter(target_type="job", target_id=str(job["id"]))
    assert list(audit.values_list("action", flat=True)) == ["job.submit", "job.approve"]


def test_org_admin_approves_and_rejection_needs_reason(world, template):
    set_policy(world, "always")
    first = submit(world, template)
    second = submit(world, template)
    assert (
        world.client("org_admin").post(f"{JOBS}{first.pk}/approve/", {}, format="json").status_code
        == 200
    )
    no_reason = world.client("owner").post(f"{JOBS}{second.pk}/reject/", {}, format="json")
    assert no_reason.status_code == 400 and "reason" in no_reason.json()["errors"]
    rejected = world.client("owner").post(
        f"{JOBS}{second.pk}/reject/", {"reason": "too big"}, format="json"
    )
    assert rejected.json()["state"] == "rejected"
    assert rejected.json()["decision_reason"] == "too big"


def test_cancel_rules(world, template):
    mine = submit(world, template, who="developer")
    theirs = submit(world, template, who="developer2")
    dev = world.client("developer")
    assert dev.post(f"{JOBS}{theirs.pk}/cancel/", {}, format="json").status_code == 403
    assert (
        world.client("viewer").post(f"{JOBS}{mine.pk}/cancel/", {}, format="json").status_code
        == 403
    )
    assert dev.post(f"{JOBS}{mine.pk}/cancel/", {}, format="json").json()["state"] == "cancelled"
    assert (
        world.client("ws_admin")
        .post(f"{JOBS}{theirs.pk}/cancel/", {"reason": "cleanup"}, format="json")
        .json()["state"]
        == "cancelled"
    )
    assert Job.objects.get(pk=theirs.pk).state == "cancelled"


def test_idempotency_key_replays_the_same_job(world, template):
    client = world.client("developer")
    body = {"template": template.pk, "name": "once"}
    first = client.post(JOBS, body, format="json", HTTP_IDEMPOTENCY_KEY="abc-123")
    assert first.status_code == 201
    count = (Job.objects.count(), AuditEvent.objects.count(), DomainEvent.objects.count())
    again = client.post(JOBS, body, format="json", HTTP_IDEMPOTENCY_KEY="abc-123")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert (Job.objects.count(), AuditEvent.objects.count(), DomainEvent.objects.count()) == count
    different = client.post(
        JOBS, {**body, "name": "other"}, format="json", HTTP_IDEMPOTENCY_KEY="abc-123"
    )
    assert different.status_code == 409
    assert different.json()["type"] == "idempotency_key_reused"
    # keys are per submitter: another developer may use the same key
    other = world.client("developer2").post(
        JOBS, body, format="json", HTTP_IDEMPOTENCY_KEY="abc-123"
    )
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]


def test_list_filters_and_stable_pages(world, template):
    set_policy(world, "threshold", {"gpu": 0})
    for index in range(5):
        submit(world, template, name=f"a{index}")
    gpu_job = submit(
        world,
        template,
        who="developer2",
        overrides={
            "worker_groups": [{"name": "g", "replicas": 1, "cpu": 1, "memory_gb": 1, "gpu": 1}]
        },
    )
    client = world.client("viewer")
    pending = client.get(JOBS, {"state": "pending_approval"}).json()
    assert [j["id"] for j in pending["results"]] == [gpu_job.pk]
    by_submitter = client.get(JOBS, {"submitter": "dev@acme.test"}).json()
    assert by_submitter["count"] == 5
    both = client.get(JOBS + "?state=queued&state=pending_approval").json()
    assert both["count"] == 6
    assert client.get(JOBS, {"template": template.pk}).json()["count"] == 6
    assert client.get(JOBS, {"created_after": "2999-01-01T00:00:00Z"}).json()["count"] == 0
    pages = [client.get(JOBS, {"page_size": 2, "page": n}).json()["results"] for n in (1, 2, 3)]
    ids = [j["id"] for page in pages for j in page]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 6
    bad = client.get(JOBS, {"state": "exploded"})
    assert bad.status_code == 400 and "state" in bad.json()["errors"]


def test_admin_panel_approves_through_the_service(world, template):
    from django.test import Client

    from tests.conftest import PASSWORD

    set_policy(world, "always")
    job = submit(world, template)
    own = submit(world, template, who="org_admin")
    client = Client()
    assert client.login(email="admin@acme.test", password=PASSWORD)
    listing = client.get("/admin/jobs/job/")
    assert listing.status_code == 200 and "counter" in listing.content.decode()
    response = client.post(
        "/admin/jobs/job/", {"action": "approve", "_selected_action": [job.pk, own.pk]}
    )
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).state == "queued"
    assert Job.objects.get(pk=own.pk).state == "pending_approval"  # no self-approval here either
    event = AuditEvent.objects.filter(action="job.approve").latest("id")
    assert event.actor_id == world.users["org_admin"].pk
    page = client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200 and "approved" in page.content.decode()


def test_a_submissions_answer_is_its_detail_without_the_queue_unless_asked(world, template):
    """The answer is rendered from the rows the submission wrote, not read back: it must say
    what the job's detail says. Its place in the queue comes only with ?include=position."""
    client = world.client("developer")
    answer = client.post(JOBS, {"template": template.pk}, format="json")
    assert answer.status_code == 201, answer.content
    submitted = answer.json()
    detail = client.get(f"{JOBS}{submitted['id']}/").json()
    assert submitted.pop("queue") is None and detail.pop("queue")["position"] == 1
    assert submitted == detail

    asked = client.post(f"{JOBS}?include=position", {"template": template.pk}, format="json")
    assert asked.status_code == 201, asked.content
    queue = asked.json()["queue"]
    assert (queue["position"], queue["queued"]) == (2, 2) and "predicted_start" in queue


def test_an_unknown_include_is_refused_naming_it(world, template):
    before = Job.objects.count()
    response = world.client("developer").post(
        f"{JOBS}?include=everything", {"template": template.pk}, format="json"
    )
    assert response.status_code == 400
    assert "include" in response.json()["errors"]
    assert Job.objects.count() == before


class PlainJobOutput(s.JobOutput):
    """JobOutput with DRF's own field building, for every instance."""

    def get_fields(self):
        return ModelSerializer.get_fields(self)


def test_a_job_renders_as_drf_builds_it_with_fields_built_once(world, template):
    """JobOutput and AttemptOutput build their fields once per process and copy them: the
    answer is what DRF's per-instance building gives, and no two renderings share a field."""
    job = JobAttemptFactory(job__workspace=world.ws, job__template_version=template.versions.get())
    job = JobAttemptFactory(job=job.job, number=2, gpu_flavor="a100").job
    read = Job.objects.select_related("submitted_by", "template_version__template")
    for _ in range(2):  # the second from the fields the first built
        rendered = s.JobOutput(read.prefetch_related("attempts").get(pk=job.pk)).data
        plain = PlainJobOutput(read.prefetch_related("attempts").get(pk=job.pk)).data
        assert rendered == plain
    assert [a["number"] for a in rendered["attempts"]] == [1, 2]
    assert rendered["gpu_flavor"] == "a100"
    first, second = s.JobOutput(job), s.JobOutput(job)
    assert first.fields["name"] is not second.fields["name"]
    assert first.fields["name"].parent is first and second.fields["name"].parent is second


def test_a_new_job_renders_its_no_attempts_without_a_query(
    world, template, django_assert_num_queries
):
    job = submit(world, template)
    marked = selectors.known_to_have_no_attempts(
        Job.objects.select_related("submitted_by", "template_version__template").get(pk=job.pk)
    )
    compiled = []
    real_as_sql = SQLCompiler.as_sql
    with django_assert_num_queries(0), mock.patch.object(
        SQLCompiler, "as_sql", autospec=True,
        side_effect=lambda *a, **k: compiled.append(a[0]) or real_as_sql(*a, **k),
    ):  # fmt: skip
        rendered = s.JobOutput(marked).data
    assert compiled == []  # nor any SQL built to find out
    prefetched = Job.objects.select_related("submitted_by", "template_version__template")
    prefetched = prefetched.prefetch_related("attempts").get(pk=job.pk)
    assert rendered == PlainJobOutput(prefetched).data
    assert rendered["attempts"] == [] and rendered["gpu_flavor"] is None
