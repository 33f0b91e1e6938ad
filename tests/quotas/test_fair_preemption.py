"""Fair-share preemption: under fair_share, an overdue head that only the organisation's
capacity keeps out preempts jobs of workspaces above their fair allocation — when, and only
when, that brings the workspaces involved closer to their fair allocations."""

import datetime as dt
import math

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import REGISTRY

from jobs import admission
from jobs.models import Job, JobEvent
from quotas.fairness import fair_allocation, unfairness
from quotas.models import Reservation
from tests.factories import FairShareUsageFactory
from tests.quotas.test_admission import (  # noqa: F401
    bare_template,
    queue_job,
    setup_quota,
    two_workspaces,
)
from tests.quotas.test_preemption import guarantee, run, state

THIRTY_MINUTES = dt.timedelta(minutes=30)


def test_fair_allocation_fills_the_satisfied_first_and_splits_the_rest_by_weight():
    alloc = fair_allocation({1: 2.0, 2: 100.0, 3: 100.0}, {1: 1.0, 2: 1.0, 3: 3.0}, 10.0)
    assert alloc == pytest.approx({1: 2.0, 2: 2.0, 3: 6.0})
    assert fair_allocation({1: 0.0}, {1: 1.0}, 10.0) == {}
    assert fair_allocation({1: 5.0, 2: 5.0}, {1: 1.0, 2: 0.0}, 10.0) == {1: 5.0}


def test_unfairness_is_the_squared_distance_of_the_shares_from_one():
    assert unfairness({1: 4.0, 2: 0.0}, {1: 2.0, 2: 2.0}, {1, 2}) == 2.0
    assert unfairness({1: 2.0}, {1: 2.0, 2: 2.0}, {1}) == 0.0


def preempted():
    return list(
        JobEvent.objects.filter(kind="preempted").order_by("id").values_list("job_id", flat=True)
    )


@pytest.fixture
def hogged(two_workspaces):  # noqa: F811
    """Capacity 8, ml and other guaranteed 2 each; other runs four 2-GPU jobs (it borrows 6)."""
    world, spaces, templates = two_workspaces
    guarantee(spaces["ml"], 2)
    guarantee(spaces["other"], 2)
    setup_quota(world, 8, "fair_share", preemption=True, fair_share_preemption=True)
    other = [
        run(world, spaces["other"], templates["other"], 2, minutes_ago=60 - i) for i in range(4)
    ]
    return world, spaces, templates, other


def test_an_overdue_job_beyond_its_guarantee_preempts_down_to_the_fair_allocations(
    hogged, django_capture_on_commit_callbacks
):
    world, spaces, templates, other = hogged
    counted = {"organization": world.org.slug, "workspace": "other", "reason": "fair_share"}
    before = REGISTRY.get_sample_value("manta_job_preemptions_total", counted) or 0
    # ml's 4-GPU job is beyond its guarantee of 2, so the guarantee gives it nothing back; its
    # fair allocation is 4 (demand 4 and 8, weights 2 and 2): it holds 0 and other 8 (x 0, 2).
    job = queue_job(world, spaces["ml"], templates["ml"], 4, minutes_ago=30)
    with django_capture_on_commit_callbacks(execute=True):
        assert admission.admit(world.org.pk) == [job]
    assert REGISTRY.get_sample_value("manta_job_preemptions_total", counted) == before + 2
    # other's two newest admissions go: both workspaces now hold exactly their fair 4
    assert set(preempted()) == {other[3], other[2]}
    assert [state(pk) for pk in other] == ["launching", "launching", "queued", "queued"]
    event = JobEvent.objects.filter(job_id=other[3], kind="preempted").get()
    assert "which holds less than its fair share" in event.reason
    assert (event.data["preempted_for"], event.data["cause"]) == (job, "fair_share")
    assert Reservation.objects.get(job_id=job, released_at__isnull=True).gpu == 4
    # at the fair allocations, nobody preempts anybody, though other's jobs are overdue now
    Job.objects.filter(pk__in=other[2:]).update(queued_at=timezone.now() - THIRTY_MINUTES)
    assert admission.admit(world.org.pk) == []
    assert len(preempted()) == 2


def test_a_job_that_has_not_waited_past_the_limit_preempts_nobody(hogged):
    world, spaces, templates, _other = hogged
    job = queue_job(world, spaces["ml"], templates["ml"], 4, minutes_ago=5)  # limit 600 s
    assert admission.admit(world.org.pk) == []
    assert state(job) == "queued" and preempted() == []


def test_off_unless_the_organisation_asks_for_it(hogged):
    world, spaces, templates, _other = hogged
    setup_quota(world, 8, "fair_share", preemption=True, fair_share_preemption=False)
    job = queue_job(world, spaces["ml"], templates["ml"], 4, minutes_ago=30)
    assert admission.admit(world.org.pk) == []
    assert state(job) == "queued" and preempted() == []


def test_no_victim_of_a_higher_priority_than_the_claimant(hogged):
    world, spaces, templates, other = hogged
    Job.objects.filter(pk__in=other).update(priority=8)
    job = queue_job(world, spaces["ml"], templates["ml"], 4, minutes_ago=30, priority=5)
    assert admission.admit(world.org.pk) == []
    assert state(job) == "queued" and preempted() == []


def test_a_preemption_that_leaves_the_shares_less_fair_is_not_made(two_workspaces):  # noqa: F811
    world, spaces, templates = two_workspaces
    guarantee(spaces["ml"], 2)
    guarantee(spaces["other"], 6)
    setup_quota(world, 8, "fair_share", preemption=True, fair_share_preemption=True)
    other = [run(world, spaces["other"], templates["other"], 2, minutes_ago=60) for _ in range(4)]
    # ml's fair allocation is 2 (weights 2 and 6), other's 6: other holds 8 (x 1.33). ml's
    # 8-GPU job would need all of it: ml at x 4 and other at 0 are further from fair (10 against
    # 1.11), so nothing is preempted, though ml holds nothing and other is over its share.
    job = queue_job(world, spaces["ml"], templates["ml"], 8, minutes_ago=30)
    assert admission.admit(world.org.pk) == []
    assert state(job) == "queued" and preempted() == []
    assert [state(pk) for pk in other] == ["launching"] * 4


def test_victims_within_their_minimum_runtime_are_spared(hogged):
    world, spaces, templates, other = hogged
    Job.objects.filter(pk__in=other[2:]).update(spec={"min_runtime_seconds": 3600})
    job = queue_job(world, spaces["ml"], templates["ml"], 4, minutes_ago=30)
    assert admission.admit(world.org.pk) == [job]
    assert set(preempted()) == {other[1], other[0]}  # not the two newest: they are protected


def test_only_a_workspaces_next_job_claims_and_only_once_it_is_overdue(hogged):
    world, spaces, templates, _other = hogged
    # ml's overdue job is not its next: a newer one of a higher priority goes first, and that
    # one has not waited long enough
    old = queue_job(world, spaces["ml"], templates["ml"], 4, minutes_ago=30, priority=3)
    new = queue_job(world, spaces["ml"], templates["ml"], 4, minutes_ago=1, priority=6)
    assert admission.admit(world.org.pk) == []
    assert (state(old), state(new)) == ("queued", "queued") and preempted() == []
    Job.objects.filter(pk=new).update(queued_at=timezone.now() - THIRTY_MINUTES)
    assert admission.admit(world.org.pk) == [new]
    assert len(preempted()) == 2


def test_no_preemption_the_policys_own_order_would_undo(hogged):
    world, spaces, templates, _other = hogged
    # ml used the GPUs heavily in the past (4 × its guarantee, decayed): admitted, its
    # fair-share key (4 ÷ 2 + 4) would be above other's once other lost two jobs (4 ÷ 2 + 0),
    # so the policy would give other the next GPUs back: nothing is preempted, though the
    # shares would be closer to the fair allocations
    FairShareUsageFactory(workspace=spaces["ml"], gpu=4 * 2 * 86_400 / math.log(2))
    job = queue_job(world, spaces["ml"], templates["ml"], 4, minutes_ago=30)
    assert admission.admit(world.org.pk) == []
    assert state(job) == "queued" and preempted() == []


def test_the_queue_is_not_read_when_nobody_holds_more_than_its_guarantees_share(
    two_workspaces,  # noqa: F811
    django_assert_num_queries,
):
    world, spaces, templates = two_workspaces
    guarantee(spaces["ml"], 2)
    guarantee(spaces["other"], 2)
    # other holds 4 of 8: its guarantee's share of the capacity, which no fair allocation of
    # a workspace that wants more is below, so nobody can be a victim
    setup_quota(world, 8, "fair_share", preemption=True, fair_share_preemption=False)
    run(world, spaces["other"], templates["other"], 4, minutes_ago=60)
    queue_job(world, spaces["ml"], templates["ml"], 6, minutes_ago=30)  # 4 are free
    with CaptureQueriesContext(connection) as off:
        assert admission.admit(world.org.pk) == []
    setup_quota(world, 8, "fair_share", preemption=True, fair_share_preemption=True)
    with django_assert_num_queries(len(off.captured_queries)):
        assert admission.admit(world.org.pk) == []
    assert preempted() == []
