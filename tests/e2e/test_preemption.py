"""Borrowing and preemption end to end, with a real Celery worker and real local Ray clusters:
a workspace borrows the GPUs another is guaranteed while they are idle; when the owner submits,
the borrower's running job is preempted (its cluster torn down, back to the queue with a
``preempted`` event), the owner's job runs, and the borrower runs again on a fresh cluster
once the capacity is free."""

from __future__ import annotations

import time

import pytest

from audit.context import Actor
from jobs.accounting import reconcile
from jobs.logs import job_logs
from jobs.models import Job, JobAttempt, JobEvent
from outbox.models import DomainEvent
from quotas.models import Reservation
from tests.e2e.test_launch import (
    TERMINAL,
    assert_cluster_gone,
    py,
    runs,
    submit,
    wait_for,
    world,  # noqa: F401  (fixture)
)
from workspaces import services as ws_services

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

ORG = "/api/v1/orgs/acme/"


def gpu_template(client, ws: str, entrypoint: str, gpu: int) -> int:
    body = {
        "name": f"gpu-{gpu}",
        "image": "rayproject/ray:2.60.0",
        "entrypoint": entrypoint,
        "head": {"cpu": 0, "memory_gb": 1},
        "worker_groups": [{"name": "gpus", "replicas": 1, "cpu": 1, "memory_gb": 1, "gpu": gpu}],
        "max_runtime_seconds": 600,
    }
    response = client.post(f"{ORG}workspaces/{ws}/templates/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_borrower_is_preempted_and_runs_again_later(world, ray_work_dir):  # noqa: F811
    admin = world.client("owner")
    ws_services.workspace_create(
        actor=Actor.for_user(world.users["owner"]), organization=world.org, slug="research"
    )
    # capacity 2 GPUs, all of it guaranteed to ml; research is guaranteed none but may borrow
    quota = {"gpu": 2, "policy": "fifo", "preemption": True}
    assert admin.patch(f"{ORG}quota/", quota, format="json").status_code == 200
    for ws, guaranteed in (("ml", 2), ("research", 0)):
        body = {"guaranteed_gpu": guaranteed, "limit_gpu": 2}
        response = admin.patch(f"{ORG}workspaces/{ws}/quota/", body, format="json")
        assert response.status_code == 200, response.content

    # the first run would take ten minutes; a second run (after preemption) ends at once
    borrower_code = (
        "import os, time; first = os.environ['MANTA_ATTEMPT'] == '1'; "
        "print('run started', flush=True); time.sleep(600 if first else 0); print('done')"
    )
    borrowing = gpu_template(admin, "research", py(borrower_code), 2)
    response = admin.post(f"{ORG}workspaces/research/jobs/", {"template": borrowing}, format="json")
    assert response.status_code == 201, response.content
    borrower = response.json()["id"]
    wait_for(borrower, {"running"})
    # its entrypoint really started on Ray
    wait_until(lambda: "run started" in job_logs(Job.objects.get(pk=borrower))["logs"].splitlines())
    first = JobAttempt.objects.get(job_id=borrower, number=1)

    owner_job = submit(world, gpu_template(admin, "ml", py("print('owner ran')"), 2))
    job = wait_for(owner_job, TERMINAL, timeout=240)
    assert job.state == "succeeded", (job.failure_reason, job.message)

    first.refresh_from_db()
    assert (first.state, first.failure_reason) == ("preempted", "preempted")
    assert_cluster_gone(first, ray_work_dir)
    preempted = JobEvent.objects.get(job_id=borrower, kind="preempted")
    assert preempted.from_state == "running" and preempted.to_state == "queued"
    assert preempted.data["preempted_for"] == owner_job
    assert DomainEvent.objects.filter(type="job.preempted", payload__job__id=borrower).exists()

    # once ml's job is done the borrower is admitted again, on a fresh cluster
    job = wait_for(borrower, TERMINAL, timeout=240)
    assert job.state == "succeeded", (job.failure_reason, job.message)
    assert runs(borrower) == 2
    attempts = list(JobAttempt.objects.filter(job_id=borrower).order_by("number"))
    assert [a.state for a in attempts] == ["preempted", "succeeded"]
    assert attempts[0].cluster_name != attempts[1].cluster_name
    kinds = list(
        JobEvent.objects.filter(job_id=borrower).order_by("id").values_list("kind", flat=True)
    )
    assert kinds.count("preempted") == 1 and kinds.count("launching") == 2
    assert not Reservation.objects.filter(released_at__isnull=True).exists()
    assert not any(reconcile().values())
    assert not Job.objects.filter(state__in=["launching", "running"]).exists()
    for attempt in attempts:
        assert_cluster_gone(attempt, ray_work_dir)


def wait_until(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.25)
