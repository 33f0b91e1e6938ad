"""Job attempts: what every step of an attempt's life stands on, and the steps admission takes.

An attempt is created when admission moves its job to ``launching`` (:func:`attempts_create`,
from ``jobs/admission.py``) and ends preempted when admission gives its capacity to a workspace
under its guarantee (:func:`attempts_preempt`). Between those, ``launching.py`` starts its cluster
and submits, and ``following.py`` follows it to its end (retries, the deadline, cancel, teardown).
What an attempt launches where is ``launch_requests.py``; the sweep that restarts lost work is
``sweep.py``; reading its logs is ``logs.py``.

Rows are the truth and every step is safe to run twice, from any worker: a step that talks to a
cluster holds the attempt's short lease (:func:`leased`), so duplicate tasks do not start two
clusters, and no database transaction is held while a launcher talks to Ray: slow calls happen
between short transactions, guarded by the lease and by the state machine's row lock.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from audit.context import Actor
from config import secrets
from config.db import copy_insert

from . import dispatch, metrics_events
from .launch_requests import ResolvedTarget, cluster_name_for, launch_request
from .launchers import launcher_for
from .models import ATTEMPT_ACTIVE, AttemptState, Job, JobAttempt, JobState
from .state import InvalidTransition, transition

logger = logging.getLogger(__name__)
SYSTEM = Actor.system("worker")


# --- admission (jobs/admission.py decides; this creates the attempt) -------------------------


def attempts_create(
    jobs: list[Job], *, gpu_flavors: dict[int, str] | None = None
) -> list[JobAttempt]:
    """Move admitted queued jobs to ``launching``, each with its next attempt (on the GPU
    flavor admission chose for it, by job pk), in the caller's transaction; their launch tasks
    are sent when it commits."""
    if not jobs:
        return []
    previous = dict(
        JobAttempt.objects.filter(job__in=jobs).values_list("job").annotate(n=Count("id"))
    )
    numbers = {job.pk: previous.get(job.pk, 0) + 1 for job in jobs}
    ids: list[str] = []
    # Registered before the transition's own hooks (the outbox dispatcher's wake-up), so the
    # launch tasks are the first thing sent when the admission commits.
    transaction.on_commit(lambda: dispatch.launch_attempts(ids), robust=True)
    locked = transition(
        jobs,
        JobState.LAUNCHING,
        actor=SYSTEM,
        data_by_job={pk: {"attempt": number} for pk, number in numbers.items()},
    )
    attempts = copy_insert(
        JobAttempt,
        (
            JobAttempt(
                job=job,
                number=numbers[job.pk],
                target_kind="",
                target_name=job.workspace.compute_target,
                cluster_name=cluster_name_for(job, numbers[job.pk]),
                gpu_flavor=(gpu_flavors or {}).get(job.pk, ""),
            )
            for job in locked
        ),
    )
    ids += [str(attempt.pk) for attempt in attempts]
    return attempts


def attempts_preempt(
    job_ids: list[int],
    *,
    reason: str,
    for_job: int,
    grace_seconds: int = 0,
    cause: str = "guarantee_reclaimed",
) -> list[int]:
    """Take capacity back from running jobs for job ``for_job`` (``cause``: its workspace is
    under its guarantee, ``guarantee_reclaimed``, or below its fair allocation, ``fair_share``;
    the events' ``data`` and the preemption metric say which), in the caller's (admission)
    transaction. Returns the ids of the jobs that are
    still leaving (in their grace period); the others are gone when the transaction commits.

    A running job, when the organisation gives a grace period, becomes ``preempting``
    (``job.preempting`` event and audit action): after commit its driver gets SIGTERM, and
    ``jobs/preempting.py`` tears its cluster down and requeues it once the driver has exited or
    the grace has passed; it holds its reservation until then. A job still launching (no
    driver to warn), or any job without a grace period, goes back to ``queued`` at once with a
    ``preempted`` event (its reservation is released by that move), its attempt ends
    ``preempted`` (so no launch or follow step acts on it again), and after commit its cluster
    is torn down. Jobs that ended meanwhile are left alone."""
    jobs = list(
        Job.objects.select_for_update(of=("self",))
        .filter(pk__in=job_ids, state__in=(JobState.LAUNCHING, JobState.RUNNING))
        .order_by("pk")
    )
    if not jobs:
        return []
    active = JobAttempt.objects.filter(job__in=jobs, state__in=ATTEMPT_ACTIVE)
    attempts = {
        job_id: (pk, n, running_at)
        for job_id, pk, n, running_at in active.values_list("job_id", "pk", "number", "running_at")
    }
    graceful = [job for job in jobs if grace_seconds > 0 and job.state == JobState.RUNNING]
    at_once = [job for job in jobs if job not in graceful]
    now = timezone.now()

    def data(job: Job, **more: Any) -> dict[str, Any]:
        attempt = attempts.get(job.pk, (None, None))[1]
        return {"attempt": attempt, "preempted_for": for_job, "cause": cause, **more}

    if graceful:
        transition(
            graceful,
            JobState.PREEMPTING,
            actor=SYSTEM,
            kind="preempting",
            reason=reason,
            audit_action="job.preempting",
            data_by_job={job.pk: data(job, grace_seconds=grace_seconds) for job in graceful},
        )
        leaving = [str(attempts[job.pk][0]) for job in graceful if job.pk in attempts]
        JobAttempt.objects.filter(pk__in=leaving).update(
            preempting_at=now, preempted_for_id=for_job, grace_seconds=grace_seconds
        )
        transaction.on_commit(
            lambda: dispatch.send_each(dispatch.PREEMPT, [(pk,) for pk in leaving]), robust=True
        )
    if at_once:
        lost = {
            job.pk: preempted_gpu_seconds(job, attempts[job.pk][2], now)
            for job in at_once
            if job.pk in attempts
        }
        transition(
            at_once,
            JobState.QUEUED,
            actor=SYSTEM,
            kind="preempted",
            reason=reason,
            data_by_job={job.pk: data(job, gpu_seconds=lost.get(job.pk, 0.0)) for job in at_once},
        )
        ended = []
        for job in at_once:
            if job.pk not in attempts:
                continue
            pk = attempts[job.pk][0]
            ended += [str(pk)]
            JobAttempt.objects.filter(pk=pk).update(
                state=AttemptState.PREEMPTED,
                failure_reason="preempted",
                finished_at=Coalesce(F("finished_at"), Value(now)),
                preempting_at=now,
                preempted_for_id=for_job,
                grace_seconds=0,
                preempted_gpu_seconds=lost[job.pk],
            )
        transaction.on_commit(lambda: metrics_events.gpu_lost(at_once, lost), robust=True)
        transaction.on_commit(
            lambda: dispatch.send_each(dispatch.EVICT, [(pk,) for pk in ended]), robust=True
        )
    return [job.pk for job in graceful]


def preempted_gpu_seconds(job: Job, running_at: dt.datetime | None, end: dt.datetime) -> float:
    """The GPU-seconds an attempt of ``job`` had run by ``end``: the work a preemption throws
    away (0 for an attempt that never ran)."""
    if running_at is None or not job.requested_gpu:
        return 0.0
    return round(max(0.0, (end - running_at).total_seconds()) * job.requested_gpu, 3)


# --- leases and handles ---------------------------------------------------------------------


def _claim(attempt_id: str, states=ATTEMPT_ACTIVE) -> bool:
    """Take the attempt's lease unless another worker holds it."""
    now = timezone.now()
    claimed = (
        JobAttempt.objects.filter(pk=attempt_id, state__in=states)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(lease_until=now + dt.timedelta(seconds=settings.MANTA_LEASE_SECONDS))
    )
    return claimed == 1


@contextlib.contextmanager
def leased(attempt_id: str, states=ATTEMPT_ACTIVE):
    """Hold the attempt's lease, renewed in the background while the body runs (starting a
    cluster takes a while). A worker that dies stops renewing, so the lease soon expires and
    the sweep can hand the attempt to another worker."""
    if not _claim(attempt_id, states):
        yield False
        return
    done = threading.Event()

    def renew() -> None:
        try:
            while not done.wait(settings.MANTA_LEASE_SECONDS / 3):
                until = timezone.now() + dt.timedelta(seconds=settings.MANTA_LEASE_SECONDS)
                JobAttempt.objects.filter(pk=attempt_id).update(lease_until=until)
        finally:
            connection.close()

    renewer = threading.Thread(target=renew, name=f"lease-{attempt_id}", daemon=True)
    renewer.start()
    try:
        yield True
    finally:
        done.set()
        renewer.join()
        JobAttempt.objects.filter(pk=attempt_id).update(lease_until=None)


def load(attempt_id: str) -> JobAttempt:
    return JobAttempt.objects.select_related("job__workspace", "job__organization").get(
        pk=attempt_id
    )


def handle_of(attempt: JobAttempt) -> dict[str, Any] | None:
    return secrets.decrypt_json(attempt.handle_encrypted) if attempt.handle_encrypted else None


def stop_orphans(attempt: JobAttempt, target: ResolvedTarget) -> None:
    """A launch killed (or cancelled) after starting a cluster but before storing its handle
    left a cluster no row points to: find it from the attempt's request and stop it."""
    launcher = launcher_for(target.kind, target.config)
    for handle in launcher.find_started(launch_request(attempt, target, sign=False)):
        logger.warning("stopping orphaned cluster %s", handle.get("cluster_name"))
        launcher.stop(handle)


def move_job(job_id: int, to_state: str, **kwargs) -> Job | None:
    """A transition the worker makes; losing a race to a user's cancel is not an error."""
    try:
        return transition(job_id, to_state, actor=SYSTEM, **kwargs)
    except InvalidTransition:
        return None
