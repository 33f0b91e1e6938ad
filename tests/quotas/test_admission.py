"""Admission order per policy on fixed scenarios, reservations, release, and why-waiting."""

import datetime as dt

import pytest
from django.utils import timezone

from audit.context import Actor
from jobs import admission
from jobs import services as job_services
from jobs.models import Job
from jobs.state import transition
from quotas.models import OrgQuota, Reservation, WorkspaceQuota
from tests.conftest import SYSTEM
from tests.factories import JobTemplateFactory, WorkspaceFactory


def bare_template(workspace):
    """A template whose jobs ask for what their overrides say (no workers of its own)."""
    return JobTemplateFactory(
        workspace=workspace,
        name="t",
        version__spec_changes={"worker_groups": []},
        version__allowed_overrides=["worker_groups", "priority"],
    )


@pytest.fixture
def two_workspaces(world):
    other = WorkspaceFactory(organization=world.org, slug="other")
    templates = {ws.slug: bare_template(ws) for ws in (world.ws, other)}
    return world, {"ml": world.ws, "other": other}, templates


def queue_job(world, ws, template, gpu, *, minutes_ago, priority=5):
    groups = [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": gpu}] if gpu else []
    job = job_services.job_submit(
        actor=Actor.for_user(world.users["owner"]),
        workspace=ws,
        template=template,
        overrides={"worker_groups": groups, "priority": priority},
    )
    Job.objects.filter(pk=job.pk).update(
        queued_at=timezone.now() - dt.timedelta(minutes=minutes_ago)
    )
    return job.pk


def setup_quota(world, gpu, policy, **extra):
    OrgQuota.objects.update_or_create(
        organization=world.org, defaults={"gpu": gpu, "policy": policy, **extra}
    )


def admitted(world):
    return admission.admit(world.org.pk)


def still_queued(*job_ids):
    return set(Job.objects.filter(pk__in=job_ids).values_list("state", flat=True)) == {"queued"}


# The policy scenario: capacity 3 GPUs; ml queues j1 (2 GPUs, 30 min ago) and j2 (2 GPUs,
# 20 min ago), other queues j3 (1 GPU, 10 min ago). j1 fits, j2 does not fit in what is left:
#   fifo → [j1] (j2 blocks), round_robin → [j1, j3] (j3 backfills),
#   balanced → [j1] once j2 has waited past the limit, [j1, j3] before.
def build(two_workspaces, sizes):
    world, spaces, templates = two_workspaces
    return world, [
        queue_job(world, spaces[ws], templates[ws], gpu, minutes_ago=age) for ws, gpu, age in sizes
    ]


def test_fifo_blocks_behind_a_head_that_does_not_fit(two_workspaces):
    world, (j1, j2, j3) = build(two_workspaces, [("ml", 2, 30), ("ml", 2, 20), ("other", 1, 10)])
    setup_quota(world, 3, "fifo")
    assert admitted(world) == [j1]  # j2 needs 2 of the 1 left and blocks j3
    assert still_queued(j2, j3)


def test_round_robin_backfills(two_workspaces):
    world, (j1, j2, j3) = build(two_workspaces, [("ml", 2, 30), ("ml", 2, 20), ("other", 1, 10)])
    setup_quota(world, 3, "round_robin")
    assert admitted(world) == [j1, j3]
    assert still_queued(j2)


def test_balanced_stops_backfill_after_the_wait(two_workspaces):
    world, (j1, j2, j3) = build(two_workspaces, [("ml", 2, 30), ("ml", 2, 20), ("other", 1, 10)])
    setup_quota(world, 3, "balanced", balanced_max_wait_seconds=15 * 60)
    assert admitted(world) == [j1]  # j2 waited 20 min > 15: nothing overtakes it
    assert still_queued(j2, j3)


def test_balanced_backfills_while_the_wait_is_short(two_workspaces):
    world, (j1, j2, j3) = build(two_workspaces, [("ml", 2, 30), ("ml", 2, 20), ("other", 1, 10)])
    setup_quota(world, 3, "balanced", balanced_max_wait_seconds=3600)
    assert admitted(world) == [j1, j3]
    assert still_queued(j2)


def test_fair_share_takes_the_lowest_dominant_share_first(two_workspaces):
    world, spaces, _ = two_workspaces
    for ws in spaces.values():
        WorkspaceQuota.objects.create(workspace=ws, guaranteed_gpu=2)
    world, (j1, j2, j3, j4) = build(
        two_workspaces, [("ml", 1, 40), ("ml", 1, 30), ("ml", 1, 20), ("other", 1, 10)]
    )
    setup_quota(world, 3, "fair_share")
    # ml 0/2 and other 0/2 tie: ml's older head j1; then other (0) before ml (0.5): j4; then a
    # tie at 0.5 goes to the older head, j2; capacity 3 is full. Strict fifo would be j1, j2, j3.
    assert admitted(world) == [j1, j4, j2]
    assert Job.objects.get(pk=j3).state == "queued"


def test_priority_comes_first(two_workspaces):
    world, spaces, templates = two_workspaces
    low = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=30, priority=2)
    high = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=1, priority=9)
    setup_quota(world, 1, "fifo")
    assert admitted(world) == [high]
    assert Job.objects.get(pk=low).state == "queued"


def test_reservations_and_release(two_workspaces):
    world, (j1, j2, j3) = build(two_workspaces, [("ml", 2, 30), ("ml", 1, 20), ("other", 1, 10)])
    setup_quota(world, 3, "round_robin")
    assert admitted(world) == [j1, j2]
    held = Reservation.objects.filter(released_at__isnull=True)
    assert sorted(held.values_list("job_id", flat=True)) == [j1, j2]
    assert sum(held.values_list("gpu", flat=True)) == 3
    transition(j1, "failed", actor=SYSTEM)  # leaving launching releases, exactly once
    assert Reservation.objects.get(job_id=j1).released_at is not None
    assert admitted(world) == [j3]
    assert Reservation.objects.filter(job_id=j1).count() == 1


def test_workspace_limit_and_running_limits(two_workspaces):
    world, spaces, _ = two_workspaces
    WorkspaceQuota.objects.create(workspace=spaces["ml"], limit_gpu=2, max_running_jobs=5)
    world, (j1, j2, j3) = build(two_workspaces, [("ml", 2, 30), ("ml", 1, 20), ("other", 1, 10)])
    setup_quota(world, 10, "round_robin", max_running_jobs=2)
    assert admitted(world) == [j1, j3]  # j2 over ml's gpu limit; then the org runs 2
    assert still_queued(j2)


def test_why_waiting(two_workspaces):
    world, spaces, _ = two_workspaces
    WorkspaceQuota.objects.create(workspace=spaces["ml"], limit_gpu=2)
    world, (j1, j2) = build(two_workspaces, [("ml", 2, 30), ("ml", 1, 20)])
    setup_quota(world, 10, "fifo")
    admitted(world)
    detail = world.client("developer").get(f"/api/v1/orgs/acme/workspaces/ml/jobs/{j2}/").json()
    assert detail["queue"].pop("predicted_start")["p50"]  # tests/jobs/test_prediction.py
    assert detail["queue"] == {
        "position": 1,
        "queued": 1,
        "waiting_for": "workspace gpu limit 2: 2 reserved, this job needs 1",
    }
    running = world.client("developer").get(f"/api/v1/orgs/acme/workspaces/ml/jobs/{j1}/").json()
    assert running["queue"] is None
