"""GPU-hour budgets: accounted from the real running time of attempts; refuse or wait; alerts at
80 % and 100 % once per month."""

import datetime as dt

from django.utils import timezone

from jobs import accounting, admission
from jobs.models import Job, JobAttempt
from outbox.models import DomainEvent
from quotas.models import WorkspaceQuota

JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"
GPU_JOB = {"worker_groups": [{"name": "g", "replicas": 1, "cpu": 1, "memory_gb": 1, "gpu": 2}],
           "max_runtime_seconds": 3600}  # fmt: skip


def ran(world, template, *, gpu_hours):
    """A finished 2-GPU attempt that ran for gpu_hours / 2 hours this month."""
    response = world.client("developer").post(
        JOBS, {"template": template.pk, "overrides": GPU_JOB}, format="json"
    )
    job = Job.objects.get(pk=response.json()["id"])
    end = timezone.now()
    JobAttempt.objects.create(
        job=job,
        number=1,
        target_kind="local",
        target_name="local",
        cluster_name="c",
        state="succeeded",
        running_at=end - dt.timedelta(hours=gpu_hours / 2),
        finished_at=end,
    )
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    return job


def test_gpu_hours_come_from_running_time(world, template):
    ran(world, template, gpu_hours=3)
    usage = world.client("viewer").get("/api/v1/orgs/acme/workspaces/ml/usage/").json()
    assert abs(usage["gpu_hours_this_month"] - 3) < 0.01


def test_refuse_over_budget(world, template):
    WorkspaceQuota.objects.create(workspace=world.ws, gpu_hours_per_month=5, budget_action="refuse")
    ran(world, template, gpu_hours=4)
    before = Job.objects.count()
    response = world.client("developer").post(
        JOBS, {"template": template.pk, "overrides": GPU_JOB}, format="json"
    )
    assert response.status_code == 409
    body = response.json()
    assert body["type"] == "budget_exhausted"
    assert body["detail"].startswith("GPU budget 5 h/month: 4 h used, this job may use up to 2 h")
    assert Job.objects.count() == before
    # a job without GPUs is not affected
    assert world.client("developer").post(JOBS, {"template": template.pk},
                                          format="json").status_code == 201  # fmt: skip


def test_queue_until_next_period(world, template):
    WorkspaceQuota.objects.create(workspace=world.ws, gpu_hours_per_month=5, budget_action="queue")
    ran(world, template, gpu_hours=4)
    response = world.client("developer").post(
        JOBS, {"template": template.pk, "overrides": GPU_JOB}, format="json"
    )
    assert response.status_code == 201
    job_id = response.json()["id"]
    assert admission.admit(world.org.pk) == []
    detail = world.client("developer").get(f"{JOBS}{job_id}/").json()
    assert detail["state"] == "queued"
    assert detail["queue"]["waiting_for"].endswith("it waits for the next budget period")


def test_threshold_events_once_per_threshold(world, template):
    WorkspaceQuota.objects.create(workspace=world.ws, gpu_hours_per_month=10, budget_action="queue")
    ran(world, template, gpu_hours=8.2)
    assert accounting.budget_alerts() == 1
    assert accounting.budget_alerts() == 0  # not again this month
    ran(world, template, gpu_hours=2)
    assert accounting.budget_alerts() == 1
    events = DomainEvent.objects.filter(type="quota.threshold_reached").order_by("occurred_at")
    assert [e.payload["threshold_percent"] for e in events] == [80, 100]
    assert events[0].payload["gpu_hours_used"] >= 8
