"""The periodic reconciliation finds drift in the admission invariants and reports it (log and,
through the sweep's metrics snapshot, /metrics)."""

from rest_framework.test import APIClient

from jobs import accounting, admission
from jobs.metrics_snapshot import snapshot_refresh
from jobs.models import Job
from quotas.models import OrgQuota, QuotaGroup, Reservation, WorkspaceQuota
from tests.factories import JobFactory

HEALTHY = {"orphan_reservations": 0, "missing_reservations": 0, "over_capacity": 0,
           "over_limit": 0, "over_running": 0}  # fmt: skip


def test_healthy_after_admission(world, template):
    # A counter job holds 2 CPUs of its sandboxes (the 0-CPU head's quota is 1): room for 3.
    OrgQuota.objects.create(organization=world.org, cpu=6)
    for _ in range(3):
        world.client("developer").post("/api/v1/orgs/acme/workspaces/ml/jobs/",
                                       {"template": template.pk}, format="json")  # fmt: skip
    assert len(admission.admit(world.org.pk)) == 3
    assert accounting.reconcile() == HEALTHY


def test_drift_is_found_and_exported(world, template, caplog):
    OrgQuota.objects.create(organization=world.org, cpu=2)  # one counter job (2 CPUs)
    WorkspaceQuota.objects.create(workspace=world.ws, limit_cpu=2)
    ids = [world.client("developer").post("/api/v1/orgs/acme/workspaces/ml/jobs/",
                                          {"template": template.pk}, format="json").json()["id"]
           for _ in range(3)]  # fmt: skip
    assert admission.admit(world.org.pk) == [ids[0]]
    # Tamper behind the scheduler's back: a job running without a reservation, a reservation
    # for a job that is not running, and more held than the capacity.
    Job.objects.filter(pk=ids[1]).update(state="running")
    Reservation.objects.create(job_id=ids[2], organization=world.org, workspace=world.ws, cpu=1,
                               memory_gb=0, gpu=0)  # fmt: skip
    drift = accounting.reconcile()
    assert drift["missing_reservations"] == 1
    assert drift["orphan_reservations"] == 1
    assert drift["over_capacity"] == 1 and drift["over_limit"] == 1
    assert "quota invariants drifted" in caplog.text
    snapshot_refresh(drift=drift)  # what the sweep does with it
    text = APIClient().get("/metrics").content.decode()
    assert 'manta_quota_drift{kind="orphan_reservations"} 1.0' in text
    assert 'manta_jobs{organization="acme",state="running",workspace="ml"} 1.0' in text


def test_flavor_drift_counts_org_group_and_workspace_over_a_flavor(world):
    """Reservations written behind admission's back: 3 h100 held under a division whose h100
    limit is 2, a workspace whose h100 limit is 2 and an organisation with 2 h100: each is one
    count of drift; the same GPUs of another flavor, or untyped, are none."""
    OrgQuota.objects.create(organization=world.org, gpu=16, gpu_flavors={"h100": 2, "a100": 8})
    division = QuotaGroup.objects.create(
        organization=world.org, name="division", gpu_flavors={"h100": {"limit": 2}}
    )
    WorkspaceQuota.objects.create(
        workspace=world.ws, group=division, gpu_flavors={"h100": {"guaranteed": 0, "limit": 2}}
    )
    assert accounting.reconcile() == HEALTHY
    for flavor, gpus in (("a100", 3), ("", 3)):
        Reservation.objects.create(job=JobFactory(workspace=world.ws, state="running"),
                                   organization=world.org, workspace=world.ws, cpu=0,
                                   memory_gb=0, gpu=gpus, gpu_flavor=flavor)  # fmt: skip
    drift = accounting.reconcile()
    assert (drift["over_capacity"], drift["over_limit"]) == (0, 0)
    Reservation.objects.create(job=JobFactory(workspace=world.ws, state="running"),
                               organization=world.org, workspace=world.ws, cpu=0, memory_gb=0,
                               gpu=3, gpu_flavor="h100")  # fmt: skip
    drift = accounting.reconcile()
    assert drift["over_capacity"] == 1  # the organisation's 2 h100
    assert drift["over_limit"] == 2  # the workspace's and the division's h100 limit
