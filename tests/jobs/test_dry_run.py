"""``POST …/jobs/?dry_run=true``: what a submission would do now, and nothing created."""

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

from jobs import admission
from quotas.models import OrgQuota, WorkspaceQuota
from tests.factories import JobTemplateFactory

JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"


@pytest.fixture
def gpu_template(world):
    return JobTemplateFactory(
        workspace=world.ws,
        name="train",
        version__spec_changes={
            "worker_groups": [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": 2}],
            "max_runtime_seconds": 3000,
        },
        version__allowed_overrides=["priority"],
    )


def row_counts() -> dict[str, int]:
    """Rows of every table of the database (audit and outbox included)."""
    with connection.cursor() as cursor:
        counts = {}
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            counts[table] = cursor.fetchone()[0]
    return counts


def dry_run(world, body, query="?dry_run=true", **headers):
    return world.client("developer").post(f"{JOBS}{query}", body, format="json", **headers)


def test_dry_runs_answer_and_create_nothing(world, gpu_template):
    OrgQuota.objects.create(organization=world.org, gpu=2)
    body = {"template": gpu_template.pk}
    before = row_counts()

    fits = dry_run(world, body, HTTP_IDEMPOTENCY_KEY="dry-1")
    assert fits.status_code == 200, fits.json()
    answer = fits.json()
    assert answer["dry_run"] is True and answer["would_admit_now"] is True
    assert (answer["state"], answer["position"], answer["blocker"]) == ("queued", 0, None)
    assert answer["waiting_for"] is None
    assert answer["requested"]["gpu"] == 2
    p50 = dt.datetime.fromisoformat(answer["predicted_start"]["p50"])
    assert abs((p50 - timezone.now()).total_seconds()) < 60
    assert row_counts() == before

    # Another job takes the 2 GPUs: the next one would wait for it to end (no history: its
    # max_runtime_seconds), first in line, for the organisation's capacity.
    running = world.client("developer").post(JOBS, body, format="json").json()
    assert admission.admit(world.org.pk) == [running["id"]]
    before = row_counts()
    queues = dry_run(world, body).json()
    assert queues["would_admit_now"] is False
    assert (queues["position"], queues["blocker"]) == (1, "org_capacity")
    assert queues["waiting_for"] == "organisation gpu capacity 2: 2 reserved, this job needs 2"
    p50 = dt.datetime.fromisoformat(queues["predicted_start"]["p50"])
    assert 2940 <= (p50 - timezone.now()).total_seconds() <= 3000
    assert row_counts() == before

    # A GPU budget it is already over: it would queue for the next period, with no prediction.
    WorkspaceQuota.objects.create(
        workspace=world.ws, gpu_hours_per_month=0.5, budget_action="queue"
    )
    before = row_counts()
    never = dry_run(world, body).json()
    assert (never["would_admit_now"], never["blocker"]) == (False, "gpu_budget")
    assert never["predicted_start"]["p50"] is None and never["predicted_start"]["p90"] is None
    assert never["predicted_start"]["why_unknown"]
    assert row_counts() == before


def test_a_job_that_needs_approval_says_so(world, gpu_template):
    world.ws.approval_policy = "always"
    world.ws.save(update_fields=["approval_policy"])
    answer = dry_run(world, {"template": gpu_template.pk}).json()
    assert (answer["state"], answer["would_admit_now"], answer["blocker"]) == (
        "pending_approval",
        False,
        "approval",
    )
    assert answer["approval_reason"]
    assert answer["waiting_for"] == f"approval: {answer['approval_reason']}"


def test_a_job_that_fits_behind_a_strict_head_is_told_whose(world, gpu_template):
    # fifo, 3 GPUs: a 2-GPU job runs, the next 2-GPU job waits for the one GPU left; a 1-GPU
    # job would fit, but no job starts before an earlier one.
    OrgQuota.objects.create(organization=world.org, gpu=3, policy="fifo")
    body = {"template": gpu_template.pk}
    running = world.client("developer").post(JOBS, body, format="json").json()["id"]
    assert admission.admit(world.org.pk) == [running]
    head = world.client("developer").post(JOBS, body, format="json").json()["id"]
    small = JobTemplateFactory(
        workspace=world.ws,
        name="small",
        version__spec_changes={
            "worker_groups": [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": 1}]
        },
    )
    answer = dry_run(world, {"template": small.pk}).json()
    assert (answer["would_admit_now"], answer["blocker"]) == (False, "queue_order")
    assert answer["waiting_for"] == (
        f"behind job {head}, which comes before it and waits (organisation gpu capacity 3: 2 "
        "reserved, this job needs 2): under fifo no job starts before an earlier one"
    )


def test_bad_input_is_the_same_400_as_a_submission(world, gpu_template):
    bad = {"template": gpu_template.pk, "overrides": {"image": "evil/image:1"}}
    submitted = world.client("developer").post(JOBS, bad, format="json")
    tried = dry_run(world, bad)
    assert submitted.status_code == tried.status_code == 400
    assert tried.json()["errors"] == submitted.json()["errors"]
    assert "overrides.image" in tried.json()["errors"]

    for value in ("maybe", "2"):
        refused = dry_run(world, {"template": gpu_template.pk}, query=f"?dry_run={value}")
        assert refused.status_code == 400
        assert list(refused.json()["errors"]) == ["dry_run"]

    no = dry_run(world, {"template": gpu_template.pk}, query="?dry_run=false")
    assert no.status_code == 201 and no.json()["state"] == "queued"


def test_a_viewer_may_not_dry_run(world, gpu_template):
    refused = world.client("viewer").post(
        f"{JOBS}?dry_run=true", {"template": gpu_template.pk}, format="json"
    )
    assert refused.status_code == 403
