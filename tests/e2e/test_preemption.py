"""Borrowing and preemption end to end, with a real Celery worker and real local Ray clusters:
a workspace borrows the GPUs another is guaranteed while they are idle; when the owner submits,
the borrower's running job is preempted with a grace period: it becomes ``preempting``, its
driver gets SIGTERM (Ray's stop_job) and writes a checkpoint from its handler while its cluster
is still up; once the driver has exited the cluster is torn down, the job goes back to the queue
(``preempted``), the owner's job gets the room it was promised, and the borrower runs again on
a fresh cluster once the capacity is free."""

from __future__ import annotations

import datetime as dt
import glob
import os
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

    # The first run would take ten minutes; a second run (after preemption) ends at once. On
    # SIGTERM the driver writes a checkpoint to its cluster's disk, says so, and takes a few
    # seconds more to finish up (well within the grace) before it exits.
    borrower_code = (
        "import os, signal, sys, time; first = os.environ['MANTA_ATTEMPT'] == '1'; "
        "path = os.path.join(os.path.expanduser('~'), 'checkpoint-' + os.environ['MANTA_JOB_ID']); "
        "signal.signal(signal.SIGTERM, lambda *_: (open(path, 'w').write('step 42'), "
        "print('checkpoint written', flush=True), time.sleep(6), sys.exit(0))); "
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
    wait_for(borrower, {"preempting"}, timeout=60)
    assert Job.objects.get(pk=owner_job).state == "queued"  # the room is not free yet
    # the driver got SIGTERM and checkpointed while its cluster was still up
    checkpoint = wait_for_file(ray_work_dir, f"checkpoint-{borrower}", timeout=30)
    with open(checkpoint) as f:
        assert f.read() == "step 42"
    first.refresh_from_db()
    assert first.torn_down_at is None and first.sigterm_at is not None
    assert Job.objects.get(pk=borrower).state == "preempting"

    job = wait_for(owner_job, TERMINAL, timeout=240)
    assert job.state == "succeeded", (job.failure_reason, job.message)

    first.refresh_from_db()
    assert (first.state, first.failure_reason) == ("preempted", "preempted")
    assert first.finished_at - first.sigterm_at < dt.timedelta(seconds=25)  # the driver exited
    assert first.preempted_gpu_seconds > 0
    assert "checkpoint written" in first.log_archive.splitlines()
    assert_cluster_gone(first, ray_work_dir)
    assert not os.path.exists(checkpoint)  # it lived on the cluster's disk, gone with it
    preempting = JobEvent.objects.get(job_id=borrower, kind="preempting")
    assert (preempting.from_state, preempting.to_state) == ("running", "preempting")
    assert preempting.data["preempted_for"] == owner_job
    preempted = JobEvent.objects.get(job_id=borrower, kind="preempted")
    assert preempted.from_state == "preempting" and preempted.to_state == "queued"
    assert preempted.data["preempted_for"] == owner_job and preempted.data["driver_exited"]
    for event_type in ("job.preempting", "job.preempted"):
        assert DomainEvent.objects.filter(type=event_type, payload__job__id=borrower).exists()
    usage = admin.get(f"{ORG}workspaces/research/usage/").json()
    assert usage["preempted_gpu_hours_this_month"] > 0

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
    assert kinds.count("preempting") == kinds.count("preempted") == 1
    assert kinds.count("launching") == 2
    assert not Reservation.objects.filter(released_at__isnull=True).exists()
    assert not any(reconcile().values())
    assert not Job.objects.filter(state__in=["launching", "running"]).exists()
    for attempt in attempts:
        assert_cluster_gone(attempt, ray_work_dir)


def wait_for_file(root: str, name: str, timeout: float) -> str:
    """The path of the file ``name`` somewhere under ``root``, once it exists."""
    deadline = time.monotonic() + timeout
    while True:
        found = glob.glob(os.path.join(root, "**", name), recursive=True)
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no {name} under {root}"
        time.sleep(0.25)


def wait_until(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.25)
