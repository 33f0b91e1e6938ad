"""The migrations that made disk a resource keep every row valid: a reservation and a job stored
before them hold 0 GB of disk, and admission counts them as before (its own module: it needs a
committed database and migrates the quotas and jobs apps back and forth)."""

import datetime as dt

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from jobs import admission
from jobs.models import Job
from quotas import selectors
from quotas.models import QuotaGroup, Reservation, WorkspaceQuota
from tests.conftest import build_world
from tests.factories import WorkspaceFactory

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


BEFORE_TREE = [("quotas", "0007_gpu_flavors")]


@pytest.mark.django_db(transaction=True)
def test_quotas_from_before_the_tree_sit_directly_under_the_organisation_unchanged():
    """Rows written before the quota tree: after the migration every workspace quota is a leaf
    directly under its organisation, lending all of its guarantee, its numbers and its
    reservations unchanged — and admission decides as the two-level rule did."""
    world = build_world()
    other = WorkspaceFactory(organization=world.org, slug="other")
    try:
        _migrate(BEFORE_TREE)  # only the quotas app goes back: its tables are as 0006 left them
        old = MigrationExecutor(connection).loader.project_state(BEFORE_TREE).apps
        OldOrgQuota = old.get_model("quotas", "OrgQuota")
        OldWorkspaceQuota = old.get_model("quotas", "WorkspaceQuota")
        OldReservation = old.get_model("quotas", "Reservation")
        OldOrgQuota.objects.create(organization_id=world.org.pk, gpu=4, policy="round_robin")
        OldWorkspaceQuota.objects.create(
            workspace_id=world.ws.pk, guaranteed_gpu=2, limit_gpu=3, fair_share_weight=2
        )
        OldWorkspaceQuota.objects.create(workspace_id=other.pk, guaranteed_gpu=2)

        def job(ws_id, state, gpu, minutes):
            return Job.objects.create(
                organization_id=world.org.pk,
                workspace_id=ws_id,
                name="old",
                state=state,
                spec={"head": {"cpu": 0, "memory_gb": 0}, "worker_groups": []},
                requested_cpu=0,
                requested_memory_gb=0,
                requested_gpu=gpu,
                requested_disk_gb=0,
                priority=5,
                queued_at=timezone.now() - dt.timedelta(minutes=minutes),
                submitted_by_id=world.users["developer"].pk,
            )

        running = job(world.ws.pk, "running", 3, 60)
        OldReservation.objects.create(
            job_id=running.pk,
            organization_id=world.org.pk,
            workspace_id=world.ws.pk,
            cpu=0,
            memory_gb=0,
            gpu=3,
        )
        over_limit = job(world.ws.pk, "queued", 1, 30)  # ml at its limit 3
        too_big = job(other.pk, "queued", 2, 20)  # 3 + 2 > capacity 4
        fits = job(other.pk, "queued", 1, 10)
        _migrate(_latest())
    finally:
        _migrate(_latest())  # no-op when done

    ml = WorkspaceQuota.objects.get(workspace=world.ws)
    assert (ml.group, ml.guaranteed_gpu, ml.limit_gpu, ml.fair_share_weight) == (None, 2, 3, 2)
    assert set(ml.lending_limit().values()) == {None}
    assert not QuotaGroup.objects.exists()
    assert Reservation.objects.get().gpu == 3
    ledger = admission.ledger_for(world.org.pk)
    assert ledger.tree.path(world.ws.pk) == () and not ledger.tree.keeps
    queued = {j.pk: j for j in Job.objects.filter(state="queued")}
    assert ledger.blocker(queued[over_limit.pk]) == (
        "workspace gpu limit 3: 3 reserved, this job needs 1"
    )
    assert ledger.blocker(queued[too_big.pk]) == (
        "organisation gpu capacity 4: 3 reserved, this job needs 2"
    )
    assert admission.admit(world.org.pk) == [fits.pk]
    tree = selectors.quota_tree(world.org)
    assert [child["name"] for child in tree["children"]] == ["ml", "other"]
