"""Backfill around an overdue ``fair_share`` head beyond its guarantee (``jobs/backfill.py``):
its reservation in time, what may still start before it, and the prediction's replay of it."""

import datetime as dt

import pytest
from django.utils import timezone

from audit.context import Actor
from jobs import admission
from jobs import services as job_services
from jobs.backfill import Shadow, shadow_for
from jobs.models import Job
from jobs.prediction import predict_start
from jobs.state import transition
from quotas.models import QuotaGroup, Reservation, WorkspaceQuota
from quotas.tree import ROOT
from tests.conftest import SYSTEM
from tests.factories import JobTemplateFactory, WorkspaceFactory
from tests.quotas.test_admission import admitted, setup_quota, still_queued

HOUR = 3600


def submit(world, ws, gpu, *, minutes_ago, max_runtime=HOUR):
    """A queued job of ``ws`` asking for ``gpu`` GPUs, whose runtime limit is ``max_runtime``."""
    template = JobTemplateFactory(
        workspace=ws,
        version__spec_changes={"worker_groups": []},
        version__allowed_overrides=["worker_groups", "max_runtime_seconds"],
    )
    node = {"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": gpu}
    job = job_services.job_submit(
        actor=Actor.for_user(world.users["owner"]),
        workspace=ws,
        template=template,
        overrides={"worker_groups": [node], "max_runtime_seconds": max_runtime},
    )
    Job.objects.filter(pk=job.pk).update(
        queued_at=timezone.now() - dt.timedelta(minutes=minutes_ago)
    )
    return job.pk


@pytest.fixture
def busy(world):
    """Capacity 6 GPUs under fair_share (heads overdue after 10 minutes). ``ml`` is guaranteed
    1 GPU and holds nothing; ``other``, guaranteed 5, runs a 2-GPU job admitted 30 minutes ago
    with a runtime limit of an hour: its deadline is in 30 minutes. 4 GPUs are free."""
    other = WorkspaceFactory(organization=world.org, slug="other")
    WorkspaceQuota.objects.create(workspace=world.ws, guaranteed_gpu=1)
    WorkspaceQuota.objects.create(workspace=other, guaranteed_gpu=5)
    setup_quota(world, 6, "fair_share", balanced_max_wait_seconds=600)
    running = submit(world, other, 2, minutes_ago=40)
    assert admitted(world) == [running]
    Reservation.objects.filter(job_id=running).update(
        created_at=timezone.now() - dt.timedelta(minutes=30)
    )
    return world, world.ws, other, running


def test_later_jobs_start_only_if_they_cannot_delay_the_overdue_head(busy):
    # ml's 5-GPU head is beyond its 1-GPU guarantee and has waited 30 minutes: its shadow time
    # is the running job's deadline (in 30 minutes), when 6 GPUs are free and 1 is spare. Of
    # the three 1-GPU jobs that fit now, the third would delay it.
    world, ml, other, _ = busy
    big = submit(world, ml, 5, minutes_ago=30)
    short = submit(world, other, 1, minutes_ago=5, max_runtime=20 * 60)  # ends before it
    long_spare = submit(world, other, 1, minutes_ago=4, max_runtime=4 * HOUR)  # the spare GPU
    long_late = submit(world, other, 1, minutes_ago=3, max_runtime=4 * HOUR)  # would delay it
    assert admitted(world) == [short, long_spare]
    assert still_queued(big, long_late)
    assert_told_of_the_reservation(long_late, big, busy)


def assert_told_of_the_reservation(job, head, busy, spare="gpu 0"):
    """The why-waiting of a job kept out by ``head``'s reservation (at the running job's
    deadline, with no GPU spare once the spare one went) names it."""
    shadow = Reservation.objects.get(job_id=busy[3]).created_at + dt.timedelta(hours=1)
    assert admission.explain(Job.objects.get(pk=job))["waiting_for"] == (
        f"job {head} has waited more than balanced_max_wait_seconds and is reserved room at "
        f"{shadow.isoformat(timespec='seconds')}, when the running jobs' max_runtime_seconds "
        f"have freed enough for it; this job's max_runtime_seconds ({4 * HOUR}) runs past "
        f"that, and it needs more than is spare then ({spare})"
    )


def test_before_the_head_is_overdue_everything_that_fits_backfills(busy):
    world, ml, other, _ = busy
    big = submit(world, ml, 5, minutes_ago=5)  # 5 minutes < balanced_max_wait_seconds
    later = [submit(world, other, 1, minutes_ago=1, max_runtime=4 * HOUR) for _ in range(3)]
    assert admitted(world) == later
    assert still_queued(big)


def test_the_head_starts_once_its_room_is_free(busy):
    world, ml, other, running = busy
    big = submit(world, ml, 5, minutes_ago=30)
    held_for_it = [submit(world, other, 1, minutes_ago=3, max_runtime=4 * HOUR) for _ in range(2)]
    assert admitted(world) == [held_for_it[0]]  # the spare GPU; the other would delay the head
    transition(running, "running", actor=SYSTEM)
    transition(running, "succeeded", actor=SYSTEM)  # ends early, long before its deadline
    assert admitted(world) == [big]
    assert still_queued(held_for_it[1])


def test_a_head_within_its_guarantee_is_still_held_for_outright(busy):
    # Guaranteed the 5 GPUs, ml is owed them: nothing that needs a GPU starts before it, not
    # even a job that would have ended by the running job's deadline.
    world, ml, other, _ = busy
    WorkspaceQuota.objects.filter(workspace=ml).update(guaranteed_gpu=5)
    WorkspaceQuota.objects.filter(workspace=other).update(guaranteed_gpu=1)
    big = submit(world, ml, 5, minutes_ago=30)
    short = submit(world, other, 1, minutes_ago=5, max_runtime=20 * 60)
    assert admitted(world) == []
    assert still_queued(big, short)


def test_under_a_quota_group_the_organisations_shadow_holds_too(busy):
    # ml and other under one division (Fair Tree) whose limit is above the organisation's
    # capacity: the same reservation applies. Once the two jobs are backfilled, the head is
    # short at the division as well (4 held + 5 > 8); what ends there frees room in both places.
    world, ml, other, _ = busy
    division = QuotaGroup.objects.create(organization=world.org, name="division", limit_gpu=8)
    WorkspaceQuota.objects.filter(workspace__in=[ml, other]).update(group=division)
    big = submit(world, ml, 5, minutes_ago=30)
    short = submit(world, other, 1, minutes_ago=5, max_runtime=20 * 60)
    long_spare = submit(world, other, 1, minutes_ago=4, max_runtime=4 * HOUR)
    long_late = submit(world, other, 1, minutes_ago=3, max_runtime=4 * HOUR)
    assert admitted(world) == [short, long_spare]
    assert still_queued(big, long_late)
    assert_told_of_the_reservation(long_late, big, busy, "gpu 2 in quota group 'division', gpu 0")


def test_a_head_short_at_its_team_is_reserved_room_there(busy):
    # ml and other in a team limited to 4 GPUs, of the organisation's 6; other runs 2 GPUs
    # until its deadline in 30 minutes. ml's overdue 3-GPU head is short at the team only
    # (2 free there, 4 in the organisation): its shadow is that deadline, with 1 GPU spare in
    # the team. Of other's two long jobs only one starts; a workspace outside the team, short
    # of nothing the head lacks, is not held back.
    world, ml, other, _ = busy
    team = QuotaGroup.objects.create(organization=world.org, name="team", limit_gpu=4)
    WorkspaceQuota.objects.filter(workspace__in=[ml, other]).update(group=team)
    outside = WorkspaceFactory(organization=world.org, slug="outside")
    WorkspaceQuota.objects.create(workspace=outside, guaranteed_gpu=0)
    big = submit(world, ml, 3, minutes_ago=30)
    in_spare = submit(world, other, 1, minutes_ago=4, max_runtime=4 * HOUR)
    late = submit(world, other, 1, minutes_ago=3, max_runtime=4 * HOUR)
    beside = submit(world, outside, 1, minutes_ago=2, max_runtime=4 * HOUR)
    assert sorted(admitted(world)) == sorted([in_spare, beside])
    assert still_queued(big, late)
    assert (
        "(gpu 0 in quota group 'team', gpu 1)"
        in admission.explain(Job.objects.get(pk=late))["waiting_for"]
    )


def test_the_prediction_replays_the_same_reservation(busy):
    # The job held back for the head is predicted to start after the head's room frees up (the
    # running job's end), not now: the replay runs the same backfill on its simulated queue.
    world, ml, other, _ = busy
    submit(world, ml, 5, minutes_ago=30)
    spare = submit(world, other, 1, minutes_ago=4, max_runtime=4 * HOUR)
    late = submit(world, other, 1, minutes_ago=3, max_runtime=4 * HOUR)
    assert admitted(world) == [spare]
    prediction = predict_start(Job.objects.get(pk=late))
    assert prediction.p50 is not None
    assert prediction.p50 > timezone.now() + dt.timedelta(seconds=60)


class Need:
    """A claim as the shadow weighs it."""

    def __init__(self, gpu, max_runtime=HOUR, workspace_id=1):
        self.pk, self.workspace_id, self.max_runtime_seconds = 0, workspace_id, max_runtime
        self.requested = {"cpu": 0.0, "memory_gb": 0.0, "gpu": float(gpu), "disk_gb": 0.0}


def test_the_shadow_is_the_first_deadline_that_frees_enough(busy):
    world, ml, *_ = busy
    ledger = admission.ledger_for(world.org.pk)  # 6 GPUs, 2 held: 4 free
    now = timezone.now()
    held = [  # in deadline order, as the pass hands them over
        (now + dt.timedelta(hours=1), ml.pk, {"gpu": 0.5}),
        (now + dt.timedelta(hours=2), ml.pk, {"gpu": 1.0}),
        (now + dt.timedelta(hours=3), ml.pk, {"gpu": 1.0}),
    ]
    head, day = Need(5, workspace_id=ml.pk), now + dt.timedelta(days=1)
    expected = Shadow(now + dt.timedelta(hours=2), {(ROOT, "gpu"): 0.5})
    assert shadow_for(ledger, head, held, day) == expected
    assert shadow_for(ledger, Need(7, workspace_id=ml.pk), held, day) is None  # never enough
    assert shadow_for(ledger, head, held, now + dt.timedelta(hours=1.5)) is None  # too far


def test_a_shadow_beyond_the_window_reserves_nothing(busy, settings):
    # The running job's deadline is 30 minutes away: with a 15-minute window the head gets no
    # reservation and every job that fits backfills; with none (0), neither.
    world, ml, other, _ = busy
    settings.MANTA_BACKFILL_WINDOW_HOURS = 0.25
    big = submit(world, ml, 5, minutes_ago=30)
    later = [submit(world, other, 1, minutes_ago=3, max_runtime=4 * HOUR) for _ in range(2)]
    assert admitted(world) == later
    settings.MANTA_BACKFILL_WINDOW_HOURS = 0
    last = submit(world, other, 1, minutes_ago=2, max_runtime=4 * HOUR)
    assert admitted(world) == [last]
    assert still_queued(big)


def test_the_spare_is_used_up_and_a_job_that_ends_in_time_needs_none():
    now = timezone.now()
    shadow = Shadow(now + dt.timedelta(hours=1), {(ROOT, "gpu"): 1.0})
    assert shadow.lets(Need(2, max_runtime=HOUR), now)  # ends exactly at the shadow time
    assert shadow.spare == {(ROOT, "gpu"): 1.0}
    assert shadow.lets(Need(1, max_runtime=2 * HOUR), now)
    assert shadow.spare == {(ROOT, "gpu"): 0.0}
    assert not shadow.lets(Need(1, max_runtime=2 * HOUR), now)
    assert shadow.lets(Need(0, max_runtime=9 * HOUR), now)  # needs nothing the head lacks
