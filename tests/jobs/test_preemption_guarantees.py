"""Preemption with guarantees, on PostgreSQL: a job within its minimum runtime is never a
victim (another is chosen), capped by its organisation; a running victim first becomes
``preempting`` (event, audit, webhook event) and keeps its reservation through its grace
period, while the room is promised to its preemptor — which preempts nobody twice and is
admitted first once the victim is gone; the GPU-hours the victim had run are recorded once."""

import datetime as dt

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from config import metrics
from jobs import admission, following, preempting
from jobs.accounting import reconcile
from jobs.launch_requests import launch_request, resolve_target
from jobs.models import Job, JobAttempt, JobEvent
from jobs.preemption import preemption_candidates
from jobs.services import job_cancel
from jobs.state import transition
from outbox.models import DomainEvent
from quotas.models import Reservation, WorkspaceQuota
from tests.conftest import SYSTEM
from tests.quotas.test_admission import (  # noqa: F401  (two_workspaces is a fixture)
    queue_job,
    setup_quota,
    two_workspaces,
)

ORG = "/api/v1/orgs/acme/"


def guarantee(ws, gpu, limit=None):
    WorkspaceQuota.objects.update_or_create(
        workspace=ws, defaults={"guaranteed_gpu": gpu, "limit_gpu": limit}
    )


def running(world, ws, template, gpu, *, ran_for, min_runtime=0, minutes_ago=30, priority=5):
    """A job admitted and running for ``ran_for`` seconds (asking for ``min_runtime``)."""
    job_id = queue_job(world, ws, template, gpu, minutes_ago=minutes_ago, priority=priority)
    if min_runtime:
        job = Job.objects.get(pk=job_id)
        Job.objects.filter(pk=job_id).update(spec={**job.spec, "min_runtime_seconds": min_runtime})
    assert job_id in admission.admit(world.org.pk)
    transition(job_id, "running", actor=SYSTEM)
    JobAttempt.objects.filter(job_id=job_id).update(
        state="running", running_at=timezone.now() - dt.timedelta(seconds=ran_for)
    )
    return job_id


def state(job_id):
    return Job.objects.get(pk=job_id).state


def held(job_id):
    return Reservation.objects.filter(job_id=job_id, released_at__isnull=True).exists()


@pytest.fixture
def borrowing(two_workspaces):  # noqa: F811
    """Capacity 4, ml and other guaranteed 2 each; a grace period of 30 s."""
    world, spaces, templates = two_workspaces
    guarantee(spaces["ml"], 2, 4)
    guarantee(spaces["other"], 2, 4)
    setup_quota(world, 4, "fifo", preemption=True)
    world.org.preemption_grace_seconds = 30
    world.org.save()
    return world, spaces, templates


# --- minimum runtime ----------------------------------------------------------------------


def test_a_young_job_is_protected_and_another_victim_is_chosen(borrowing):
    world, spaces, templates = borrowing
    other, tpl = spaces["other"], templates["other"]
    # other holds all 4 GPUs (2 borrowed from ml); the young job is the newest admission, so
    # it would be the first victim
    old = running(world, other, tpl, 1, ran_for=3600, min_runtime=600, minutes_ago=40)
    middle = running(world, other, tpl, 2, ran_for=3600, minutes_ago=35)
    young = running(world, other, tpl, 1, ran_for=60, min_runtime=600, minutes_ago=30)
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=1)
    assert admission.admit(world.org.pk) == []  # the victim has a grace period: it waits
    assert state(young) == "running"  # 60 s of its 600 s minimum: no victim
    assert state(middle) == "preempting"  # the next newest goes instead
    assert state(old) == "running"  # one victim made room
    assert state(owner_job) == "queued"


def test_no_victim_at_all_while_every_borrower_is_young(borrowing):
    world, spaces, templates = borrowing
    young = running(world, spaces["other"], templates["other"], 4, ran_for=10, min_runtime=300)
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == []
    assert (state(young), state(owner_job)) == ("running", "queued")
    assert not JobEvent.objects.filter(kind__in=["preempting", "preempted"]).exists()
    # once it has run its minimum it is fair game
    JobAttempt.objects.filter(job_id=young).update(
        running_at=timezone.now() - dt.timedelta(seconds=301)
    )
    admission.admit(world.org.pk)
    assert state(young) == "preempting"


def test_a_launching_job_with_a_minimum_is_not_preempted_before_it_runs(borrowing):
    world, spaces, templates = borrowing
    job_id = queue_job(world, spaces["other"], templates["other"], 4, minutes_ago=30)
    job = Job.objects.get(pk=job_id)
    Job.objects.filter(pk=job_id).update(spec={**job.spec, "min_runtime_seconds": 60})
    admission.admit(world.org.pk)
    queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == []
    assert state(job_id) == "launching"


def test_the_organisations_cap_bounds_a_minimum_already_stored(borrowing):
    world, spaces, templates = borrowing
    old = running(world, spaces["other"], templates["other"], 4, ran_for=120, min_runtime=3600)
    queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == []
    assert state(old) == "running"
    world.org.max_min_runtime_seconds = 60  # lowered since: 120 s is enough now
    world.org.save()
    admission.admit(world.org.pk)
    assert state(old) == "preempting"


def test_the_candidates_are_one_query(borrowing, django_assert_num_queries):
    world, spaces, templates = borrowing
    for minutes in (40, 30, 20):
        running(world, spaces["other"], templates["other"], 1, ran_for=60, minutes_ago=minutes)
    with django_assert_num_queries(1):
        candidates = preemption_candidates(world.org.pk)
    assert len(candidates) == 3 and all(c.running_since for c in candidates)


# --- validation -----------------------------------------------------------------------------


def gpu_template_body(**extra):
    return {
        "name": "t1",
        "image": "rayproject/ray:2.60.0",
        "entrypoint": "python main.py",
        "head": {"cpu": 0, "memory_gb": 1},
        **extra,
    }


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (-1, "greater than or equal to 0"),
        (3601, "at most 3600, the organisation's max_min_runtime_seconds"),
        ("soon", "valid integer"),
        (1.5, "valid integer"),
    ],
)
def test_min_runtime_is_validated_against_the_organisations_cap(world, value, rule):
    admin = world.client("owner")
    body = gpu_template_body(min_runtime_seconds=value)
    response = admin.post(f"{ORG}workspaces/ml/templates/", body, format="json")
    assert response.status_code == 400, response.content
    assert rule in " ".join(response.json()["errors"]["min_runtime_seconds"])


def test_min_runtime_within_the_cap_is_kept(world):
    admin = world.client("owner")
    response = admin.patch(ORG, {"max_min_runtime_seconds": 7200}, format="json")
    assert response.status_code == 200 and response.json()["max_min_runtime_seconds"] == 7200
    body = gpu_template_body(min_runtime_seconds=7200)
    response = admin.post(f"{ORG}workspaces/ml/templates/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["min_runtime_seconds"] == 7200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("preemption_grace_seconds", -1),
        ("preemption_grace_seconds", 3601),
        ("max_min_runtime_seconds", -5),
        ("max_min_runtime_seconds", 10**9),
    ],
)
def test_org_preemption_settings_are_bounded(world, field, value):
    response = world.client("owner").patch(ORG, {field: value}, format="json")
    assert response.status_code == 400 and field in response.json()["errors"]


def test_org_defaults(world):
    body = world.client("owner").get(ORG).json()
    assert (body["preemption_grace_seconds"], body["max_min_runtime_seconds"]) == (30, 3600)


# --- the grace period -------------------------------------------------------------------------


def test_a_running_victim_is_preempting_and_keeps_its_reservation(borrowing):
    world, spaces, templates = borrowing
    borrower = running(world, spaces["other"], templates["other"], 4, ran_for=900)
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == []
    assert (state(borrower), state(owner_job)) == ("preempting", "queued")
    assert held(borrower) and not held(owner_job)  # the cluster is still up
    event = JobEvent.objects.filter(job_id=borrower).latest("id")
    assert (event.from_state, event.to_state, event.kind) == ("running", "preempting", "preempting")
    assert event.data["preempted_for"] == owner_job and event.data["grace_seconds"] == 30
    assert DomainEvent.objects.filter(type="job.preempting", payload__job__id=borrower).exists()
    assert not DomainEvent.objects.filter(type="job.preempted", payload__job__id=borrower).exists()
    audit = AuditEvent.objects.filter(action="job.preempting").get()
    assert audit.target_id == str(borrower) and audit.changes == {
        "state": ["running", "preempting"]
    }
    attempt = JobAttempt.objects.get(job_id=borrower)
    assert attempt.state == "running" and attempt.preempted_for_id == owner_job
    assert attempt.grace_seconds == 30 and attempt.preempting_at is not None
    assert not any(reconcile().values())

    # later passes neither preempt again for it nor hand its promised room to anyone else
    assert admission.admit(world.org.pk) == []
    assert JobEvent.objects.filter(kind="preempting").count() == 1
    assert state(owner_job) == "queued"


def test_the_grace_period_is_what_the_driver_gets(world, borrowing):
    world, spaces, templates = borrowing
    borrower = running(world, spaces["other"], templates["other"], 4, ran_for=900)
    attempt = JobAttempt.objects.get(job_id=borrower)
    env = launch_request(attempt, resolve_target(attempt.job)).spec["runtime_env"]["env_vars"]
    assert env["RAY_JOB_STOP_WAIT_TIME_S"] == "30"  # Ray's SIGTERM → SIGKILL wait
    queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    admission.admit(world.org.pk)
    attempt.refresh_from_db()
    assert preempting.grace_ends(attempt) == attempt.preempting_at + dt.timedelta(seconds=30)


def test_no_grace_preempts_at_once_as_before(borrowing):
    world, spaces, templates = borrowing
    world.org.preemption_grace_seconds = 0
    world.org.save()
    borrower = running(world, spaces["other"], templates["other"], 4, ran_for=1800)
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    assert admission.admit(world.org.pk) == [owner_job]
    assert state(borrower) == "queued" and not held(borrower)
    attempt = JobAttempt.objects.get(job_id=borrower)
    assert attempt.state == "preempted"
    assert attempt.preempted_gpu_seconds == pytest.approx(4 * 1800, abs=4 * 5)


def gpu_hours_counted(world, ws) -> float:
    labels = {"organization": world.org.slug, "workspace": ws.slug}
    return metrics.PREEMPTED_GPU_HOURS.labels(**labels)._value.get()


def test_the_end_of_the_grace_requeues_the_victim_and_admits_the_preemptor(
    borrowing, django_capture_on_commit_callbacks
):
    world, spaces, templates = borrowing
    borrower = running(world, spaces["other"], templates["other"], 4, ran_for=1800)
    owner_job = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    admission.admit(world.org.pk)
    attempt = JobAttempt.objects.get(job_id=borrower)
    before = gpu_hours_counted(world, spaces["other"])

    # no handle (nothing to signal here): the step ends the grace at once
    with django_capture_on_commit_callbacks(execute=True):
        assert preempting.attempt_preempting_step(str(attempt.pk)) is False
    attempt.refresh_from_db()
    assert (attempt.state, attempt.failure_reason) == ("preempted", "preempted")
    assert attempt.torn_down_at is not None and attempt.finished_at is not None
    assert attempt.preempted_gpu_seconds == pytest.approx(4 * 1800, abs=4 * 5)
    # the victim is queued again — older in the queue than the owner's job, yet the room it
    # left goes to the job it was preempted for
    assert state(borrower) == "queued" and not held(borrower)
    assert state(owner_job) == "launching" and held(owner_job)
    event = JobEvent.objects.filter(job_id=borrower).latest("id")
    assert (event.from_state, event.to_state, event.kind) == ("preempting", "queued", "preempted")
    assert event.data["preempted_for"] == owner_job
    types = list(
        DomainEvent.objects.filter(payload__job__id=borrower)
        .order_by("occurred_at", "id")
        .values_list("type", flat=True)
    )
    assert types[-3:] == ["job.preempting", "job.preempted", "job.queued"]
    assert not any(reconcile().values())

    # counted once: the attempt, the workspace's usage, the counter
    hours = 4 * 1800 / 3600
    assert gpu_hours_counted(world, spaces["other"]) - before == pytest.approx(hours, abs=0.01)
    usage = world.client("owner").get(f"{ORG}workspaces/other/usage/").json()
    assert usage["preempted_gpu_hours_this_month"] == pytest.approx(hours, abs=0.01)
    with django_capture_on_commit_callbacks(execute=True):
        assert preempting.attempt_preempting_step(str(attempt.pk)) is False
        preempting.preemption_finish(str(attempt.pk), None)
        following.attempt_evict(str(attempt.pk))
    attempt.refresh_from_db()
    assert attempt.preempted_gpu_seconds == pytest.approx(4 * 1800, abs=4 * 5)
    assert gpu_hours_counted(world, spaces["other"]) - before == pytest.approx(hours, abs=0.01)
    assert JobEvent.objects.filter(job_id=borrower, kind="preempted").count() == 1


def test_a_victim_cancelled_in_its_grace_is_cancelled(borrowing):
    world, spaces, templates = borrowing
    borrower = running(world, spaces["other"], templates["other"], 4, ran_for=600)
    queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1)
    admission.admit(world.org.pk)
    job_cancel(actor=SYSTEM, job=Job.objects.get(pk=borrower), may_cancel_any=True, reason="enough")
    assert state(borrower) == "cancelled" and not held(borrower)
    attempt = JobAttempt.objects.get(job_id=borrower)
    assert preempting.attempt_preempting_step(str(attempt.pk)) is False  # not its any more
    assert not JobEvent.objects.filter(job_id=borrower, kind="preempted").exists()
