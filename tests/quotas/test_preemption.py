"""Borrowing idle capacity, and giving it back: a workspace under its guarantee whose next job
fits within it preempts the running jobs of workspaces above theirs — lowest priority first,
then the newest — and nothing else."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs import admission, following, launching
from jobs.accounting import reconcile
from jobs.models import Job, JobAttempt, JobEvent
from outbox.models import DomainEvent
from quotas.models import Reservation, WorkspaceQuota
from tests.factories import WorkspaceFactory
from tests.quotas.test_admission import (  # noqa: F401
    bare_template,
    queue_job,
    setup_quota,
    two_workspaces,
)


def guarantee(ws, gpu, limit=None):
    WorkspaceQuota.objects.update_or_create(
        workspace=ws, defaults={"guaranteed_gpu": gpu, "limit_gpu": limit}
    )


def run(world, ws, template, gpu, *, priority=5, minutes_ago=30):
    """Queue a job and admit it (it holds its reservation from then on)."""
    job_id = queue_job(world, ws, template, gpu, minutes_ago=minutes_ago, priority=priority)
    assert job_id in admission.admit(world.org.pk)
    return job_id


def state(job_id):
    return Job.objects.get(pk=job_id).state


@pytest.fixture
def borrowed(two_workspaces):  # noqa: F811
    """Capacity 4: ml and other are guaranteed 2 each. other borrows ml's idle 2 GPUs."""
    world, spaces, templates = two_workspaces
    guarantee(spaces["ml"], 2, 4)
    guarantee(spaces["other"], 2, 4)
    setup_quota(world, 4, "fifo", preemption=True)
    borrower = run(world, spaces["other"], templates["other"], 4)
    return world, spaces, templates, borrower


def test_borrowing_uses_idle_capacity_up_to_the_limit(borrowed):
    *_, borrower = borrowed
    assert state(borrower) == "launching"
    held = Reservation.objects.get(job_id=borrower, released_at__isnull=True)
    assert held.gpu == 4  # 2 guaranteed + 2 borrowed from ml, which is idle


def test_owner_under_its_guarantee_preempts_the_borrower(borrowed):
    world, spaces, templates, borrower = borrowed
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == [owner_job]
    assert state(owner_job) == "launching"
    assert state(borrower) == "queued"
    event = JobEvent.objects.filter(job_id=borrower).latest("id")
    assert (event.from_state, event.to_state, event.kind) == ("launching", "queued", "preempted")
    assert f"preempted for job {owner_job} of workspace ml" in event.reason
    assert event.data["preempted_for"] == owner_job
    assert event.data["cause"] == "guarantee_reclaimed"
    [attempt] = JobAttempt.objects.filter(job_id=borrower)
    assert (attempt.state, attempt.failure_reason) == ("preempted", "preempted")
    assert attempt.finished_at is not None
    # the borrower's reservation was released in the same move; the owner holds its own
    assert not Reservation.objects.filter(job_id=borrower, released_at__isnull=True).exists()
    assert Reservation.objects.get(job_id=owner_job, released_at__isnull=True).gpu == 2
    types = list(
        DomainEvent.objects.filter(payload__job__id=borrower)
        .order_by("occurred_at", "id")
        .values_list("type", flat=True)
    )
    assert types[-2:] == ["job.preempted", "job.queued"]
    assert not any(reconcile().values())
    # the preempted job waits for the capacity it borrowed, and says so
    assert admission.explain(Job.objects.get(pk=borrower))["waiting_for"].startswith(
        "organisation gpu capacity 4: 2 reserved"
    )


def test_evicting_a_preempted_attempt_tears_it_down_once(borrowed):
    world, spaces, templates, borrower = borrowed
    queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    admission.admit(world.org.pk)
    attempt = JobAttempt.objects.get(job_id=borrower)
    launching.attempt_launch(str(attempt.pk))  # a late launch task does nothing
    attempt.refresh_from_db()
    assert not attempt.handle_encrypted and attempt.cluster_ready_at is None
    following.attempt_evict(str(attempt.pk))
    attempt.refresh_from_db()
    assert attempt.torn_down_at is not None and attempt.state == "preempted"


def test_no_preemption_when_the_org_has_it_off(borrowed):
    world, spaces, templates, borrower = borrowed
    setup_quota(world, 4, "fifo", preemption=False)
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == []
    assert (state(owner_job), state(borrower)) == ("queued", "launching")


def test_no_preemption_for_a_job_beyond_the_guarantee(borrowed):
    world, spaces, templates, borrower = borrowed
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 3, minutes_ago=1)  # guarantee 2
    assert admission.admit(world.org.pk) == []
    assert (state(owner_job), state(borrower)) == ("queued", "launching")


def test_victims_lowest_priority_first_then_newest(two_workspaces):  # noqa: F811
    world, spaces, templates = two_workspaces
    guarantee(spaces["ml"], 2, 4)
    guarantee(spaces["other"], 2, 4)
    setup_quota(world, 4, "fifo", preemption=True)
    other, tpl = spaces["other"], templates["other"]
    high = run(world, other, tpl, 1, priority=8, minutes_ago=40)
    low_old = run(world, other, tpl, 1, priority=2, minutes_ago=30)
    low_new = run(world, other, tpl, 1, priority=2, minutes_ago=20)
    mid = run(world, other, tpl, 1, priority=5, minutes_ago=10)
    Reservation.objects.filter(job_id=low_old).update(
        created_at=timezone.now() - dt.timedelta(minutes=5)
    )
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == [owner_job]
    # two GPUs are needed: the two priority-2 jobs go, the newer admission first
    assert {j: state(j) for j in (high, low_old, low_new, mid)} == {
        high: "launching",
        low_old: "queued",
        low_new: "queued",
        mid: "launching",
    }
    order = list(
        JobEvent.objects.filter(kind="preempted").order_by("id").values_list("job_id", flat=True)
    )
    assert sorted(order) == sorted([low_new, low_old])


def test_only_borrowers_are_preempted(two_workspaces):  # noqa: F811
    world, spaces, templates = two_workspaces
    third = WorkspaceFactory(organization=world.org, slug="third")
    third_tpl = bare_template(third)
    # capacity 6: ml 2, other 2 (within its guarantee, at priority 1), third 0 (all borrowed)
    guarantee(spaces["ml"], 2, 6)
    guarantee(spaces["other"], 2, 6)
    guarantee(third, 0, 6)
    setup_quota(world, 6, "fifo", preemption=True)
    within = run(world, spaces["other"], templates["other"], 2, priority=1, minutes_ago=40)
    borrowers = [run(world, third, third_tpl, 2, priority=9, minutes_ago=m) for m in (30, 20)]
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == [owner_job]
    assert state(within) == "launching"  # lowest priority, but within its guarantee
    assert [state(j) for j in borrowers] == ["launching", "queued"]  # the newer one goes


def test_nothing_is_preempted_when_it_would_not_make_room(two_workspaces):  # noqa: F811
    world, spaces, templates = two_workspaces
    guarantee(spaces["ml"], 2, 4)
    guarantee(spaces["other"], 2, 4)
    # the org runs at most 2 jobs; other runs 2 within its guarantee: nobody borrows, so ml's
    # job, though within its guarantee, waits for the running limit
    setup_quota(world, 4, "fifo", preemption=True, max_running_jobs=2)
    within = [run(world, spaces["other"], templates["other"], 1) for _ in range(2)]
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=1)
    assert admission.admit(world.org.pk) == []
    assert [state(j) for j in within] == ["launching", "launching"]
    assert state(owner_job) == "queued"
    assert not JobEvent.objects.filter(kind="preempted").exists()


def test_a_running_limit_is_freed_from_a_borrower(two_workspaces):  # noqa: F811
    world, spaces, templates = two_workspaces
    guarantee(spaces["ml"], 2, 4)
    guarantee(spaces["other"], 1, 4)
    setup_quota(world, 4, "fifo", preemption=True, max_running_jobs=2)
    within = run(world, spaces["other"], templates["other"], 1, minutes_ago=40)
    borrower = run(world, spaces["other"], templates["other"], 1, minutes_ago=30)
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=1)
    assert admission.admit(world.org.pk) == [owner_job]
    assert (state(within), state(borrower)) == ("launching", "queued")
