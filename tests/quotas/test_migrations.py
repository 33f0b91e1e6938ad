"""The migrations that made disk a resource keep every row valid: a reservation and a job stored
before them hold 0 GB of disk, and admission counts them as before (its own module: it needs a
committed database and migrates the quotas and jobs apps back and forth)."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs import admission
from jobs.models import Job
from quotas.models import Reservation, WorkspaceQuota
from tests.conftest import build_world

BEFORE = [("quotas", "0004_reservation_host"), ("jobs", "0010_remove_job_idempotency_key")]


def _migrate(targets):
    MigrationExecutor(connection).migrate(targets)


def _latest():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


@pytest.mark.django_db(transaction=True)
def test_rows_from_before_disk_counted_hold_no_disk():
    world = build_world()
    try:
        _migrate(BEFORE)
        old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
        OldJob = old.get_model("jobs", "Job")
        OldReservation = old.get_model("quotas", "Reservation")
        jobs = [
            OldJob.objects.create(
                organization_id=world.org.pk,
                workspace_id=world.ws.pk,
                name="old",
                state=state,
                spec={"head": {"cpu": 1, "memory_gb": 2}, "worker_groups": []},
                requested_cpu=1,
                requested_memory_gb=2,
                requested_gpu=0,
                priority=5,
                submitted_by_id=world.users["developer"].pk,
            )
            for state in ("running", "queued")
        ]
        OldReservation.objects.create(
            job_id=jobs[0].pk,
            organization_id=world.org.pk,
            workspace_id=world.ws.pk,
            cpu=1,
            memory_gb=2,
            gpu=0,
            host="local",
        )
        _migrate(_latest())
    finally:
        _migrate(_latest())  # no-op when done

    held = Reservation.objects.get()
    assert (held.cpu, held.memory_gb, held.gpu, held.disk_gb) == (1, 2, 0, 0)
    running, queued = Job.objects.order_by("pk")
    assert (
        running.requested
        == queued.requested
        == {
            "cpu": 1,
            "memory_gb": 2,
            "gpu": 0,
            "disk_gb": 0,
        }
    )
    # Admission counts them with 0 disk: a workspace allowed no disk still admits the old job.
    WorkspaceQuota.objects.create(workspace=world.ws, limit_disk_gb=0)
    ledger = admission.ledger_for(world.org.pk)
    assert (ledger.org.cpu, ledger.org.disk_gb, ledger.host.disk_gb) == (1, 0, 0)
    assert ledger.blocker(queued) == ""
    assert admission.admit(world.org.pk) == [queued.pk]
