"""Why a queued job that fits on its own waits (``jobs/waiting.py``): what of the queue keeps
it out of the next pass, under each policy, with nothing written."""

import pytest

from jobs import admission, waiting
from jobs.models import Job
from jobs.prediction import predict_start
from quotas.models import QuotaGroup, WorkspaceQuota
from tests.jobs.test_dry_run import row_counts
from tests.quotas import test_admission
from tests.quotas.test_admission import admitted, build, queue_job, setup_quota

two_workspaces = test_admission.two_workspaces  # a fixture

NEXT_PASS = "waiting for the next admission pass"


def waiting_for(job_id: int) -> str:
    return admission.explain(Job.objects.get(pk=job_id))["waiting_for"]


@pytest.fixture
def blocked_head(two_workspaces):
    """Capacity 3 GPUs; ml's j1 (2 GPUs) runs, ml's j2 (2 GPUs, queued 20 minutes ago) does
    not fit in the 1 left, other's j3 (1 GPU, 10 minutes ago) does."""

    def make(policy, **extra):
        world, (j1, j2, j3) = build(
            two_workspaces, [("ml", 2, 30), ("ml", 2, 20), ("other", 1, 10)]
        )
        setup_quota(world, 3, policy, **extra)
        assert admitted(world) == [j1]
        return world, j2, j3

    return make


CAPACITY = "organisation gpu capacity 3: 2 reserved, this job needs 2"


def test_fifo_a_job_that_fits_waits_behind_the_head(blocked_head):
    _, j2, j3 = blocked_head("fifo")
    assert waiting_for(j2) == CAPACITY  # the head: what the ledger says, as before
    assert waiting_for(j3) == (
        f"behind job {j2}, which comes before it and waits ({CAPACITY}): under fifo no job "
        "starts before an earlier one"
    )
    predicted = predict_start(Job.objects.get(pk=j3))
    assert (predicted.blocker, predicted.waiting_for) == ("queue_order", waiting_for(j3))


def test_balanced_once_the_head_has_waited_its_turn(blocked_head):
    _, j2, j3 = blocked_head("balanced", balanced_max_wait_seconds=600)  # j2: 20 minutes
    assert waiting_for(j3) == (
        f"behind job {j2}, which comes before it and waits ({CAPACITY}): it has waited more "
        "than balanced_max_wait_seconds (600), so later jobs no longer go first"
    )


def test_intelligent_a_strict_priority_head(two_workspaces):
    world, spaces, templates = two_workspaces
    running = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=30, priority=8)
    head = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=2, priority=8)
    small = queue_job(world, spaces["other"], templates["other"], 1, minutes_ago=1, priority=3)
    setup_quota(world, 3, "intelligent")
    assert admitted(world) == [running]
    assert waiting_for(small) == (
        f"behind job {head}, which comes before it and waits ({CAPACITY}): under intelligent "
        "its priority 8 keeps strict order"
    )


def test_a_job_the_next_pass_admits_is_told_so_and_nothing_is_written(blocked_head):
    # Under round robin j3 goes past j2: the next pass admits it (none has run since the
    # policy changed).
    world, j2, j3 = blocked_head("fifo")
    setup_quota(world, 3, "round_robin")
    before = row_counts()
    assert waiting_for(j3) == NEXT_PASS
    assert waiting_for(j2) == CAPACITY
    assert row_counts() == before


def test_fair_share_a_job_behind_its_workspaces_head(two_workspaces):
    # ml's 3-GPU head does not fit in the 1 GPU left and has not waited long: ml waits this
    # pass, its 1-GPU job with it, though that one would fit.
    world, spaces, _ = two_workspaces
    for ws in spaces.values():
        WorkspaceQuota.objects.create(workspace=ws, guaranteed_gpu=2)
    world, (running, head, small) = build(
        two_workspaces, [("other", 2, 30), ("ml", 3, 2), ("ml", 1, 1)]
    )
    setup_quota(world, 3, "fair_share", balanced_max_wait_seconds=600)
    assert admitted(world) == [running]
    assert waiting_for(small) == (
        f"behind job {head}, first in its workspace's queue: organisation gpu capacity 3: 2 "
        "reserved, this job needs 3"
    )


def test_fair_share_capacity_held_back_for_an_overdue_job(two_workspaces):
    # ml is guaranteed 3 GPUs and its head has waited 20 minutes for them: the free GPU is
    # held back for it, and other's 1-GPU job waits, at the organisation and under a group.
    world, spaces, _ = two_workspaces
    WorkspaceQuota.objects.create(workspace=spaces["ml"], guaranteed_gpu=3)
    WorkspaceQuota.objects.create(workspace=spaces["other"], guaranteed_gpu=0)
    world, (running, head, small) = build(
        two_workspaces, [("other", 2, 30), ("ml", 3, 20), ("other", 1, 1)]
    )
    setup_quota(world, 3, "fair_share", balanced_max_wait_seconds=600)
    assert admitted(world) == [running]
    held = (
        f"held back for job {head}, which has waited more than balanced_max_wait_seconds for "
        "capacity within its workspace's guarantee"
    )
    assert waiting_for(small) == f"gpu {held}"
    predicted = predict_start(Job.objects.get(pk=small))  # a dry run's blocker and words
    assert (predicted.blocker, predicted.waiting_for) == ("held_back", f"gpu {held}")
    division = QuotaGroup.objects.create(organization=world.org, name="division", limit_gpu=8)
    WorkspaceQuota.objects.update(group=division)
    assert waiting_for(small) == f"gpu at the organisation {held}"
    assert waiting_for(head) == "organisation gpu capacity 3: 2 reserved, this job needs 3"


def test_behind_many_jobs_that_fit_the_pass_is_cut_short(two_workspaces, monkeypatch):
    # Workers down, a queue of jobs that all fit: a job's detail does not replay the whole
    # queue. The pass stops once it has admitted MOST_ADMITTED jobs before the job.
    monkeypatch.setattr(waiting, "MOST_ADMITTED", 2)
    world, spaces, templates = two_workspaces
    jobs = [
        queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=10 - i) for i in range(4)
    ]
    setup_quota(world, 10, "fifo")
    assert waiting_for(jobs[1]) == NEXT_PASS  # admitted second: decided there
    assert waiting_for(jobs[3]) == (
        "waiting for the next admission pass, which admits more than 2 jobs before it"
    )
