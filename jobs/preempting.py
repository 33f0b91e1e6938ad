"""The grace period of a preempted job: warn the driver, wait, then take the capacity back.

A running job chosen as a victim becomes ``preempting`` (``jobs/attempts.py``'s
``attempts_preempt``) and keeps its reservation. Then, step by step (a Celery task that
reschedules itself, restarted by the sweep when lost): :func:`attempt_preempting_step` asks Ray
to stop the driver (SIGTERM, and Ray's own SIGKILL after ``RAY_JOB_STOP_WAIT_TIME_S``, which the
launch set to the grace period), watches for the driver to exit, and once it has — or the grace
has passed — :func:`preemption_finish` tears the cluster down and, in one transaction under the
organisation's admission lock, ends the attempt ``preempted`` (recording the GPU-seconds it had
run), requeues the job (``preempted``, its reservation released) and admits the job it made
room for first, so the room goes where it was promised. A job that succeeded before its driver
got the signal keeps its success.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging

from django.db import transaction
from django.utils import timezone

from . import metrics_events
from .admission import admit, lock_admission
from .attempts import handle_of, leased, load, move_job, preempted_gpu_seconds
from .following import attempt_teardown
from .launch_requests import resolve_target
from .launchers import cluster_text, launcher_for
from .launchers.base import RAY_SUCCEEDED, RAY_TERMINAL, LaunchError, RayJobState
from .models import ATTEMPT_ACTIVE, AttemptState, Job, JobAttempt, JobState

logger = logging.getLogger(__name__)


def attempt_preempting_step(attempt_id: str) -> bool:
    """One step of a preempted attempt's grace period. True when the caller should schedule
    another step; False when it is over (or was never this step's: the job was cancelled, or
    the attempt ended already). Safe to run twice."""
    attempt = load(attempt_id)
    if attempt.state not in ATTEMPT_ACTIVE or attempt.job.state != JobState.PREEMPTING:
        return False
    with leased(attempt_id) as held:
        if not held:
            return True  # a launch or cancel step holds it: look again shortly
        attempt = load(attempt_id)
        now = timezone.now()
        JobAttempt.objects.filter(pk=attempt_id).update(heartbeat_at=now)
        handle = handle_of(attempt)
        if handle is None:
            preemption_finish(attempt_id, None)
            return False
        target = resolve_target(attempt.job)
        launcher = launcher_for(target.kind, target.config)
        if attempt.sigterm_at is None:
            try:
                signalled = launcher.stop_driver(handle)
            except LaunchError as exc:
                logger.warning("Preempting %s: stopping its driver failed: %s", attempt_id, exc)
                signalled = False
            # Asked once: Ray escalates by itself, and a grace without a driver to warn
            # simply runs out.
            JobAttempt.objects.filter(pk=attempt_id).update(sigterm_at=now)
            if signalled:
                return True
        state = None
        with contextlib.suppress(LaunchError):
            state = launcher.status(handle)
        driver_running = state is None or state.status not in RAY_TERMINAL
        if driver_running and now < grace_ends(attempt):
            return True
        preemption_finish(attempt_id, state)
        return False


def grace_ends(attempt: JobAttempt) -> dt.datetime:
    """When the attempt's grace period is over."""
    started = attempt.preempting_at or timezone.now()
    return started + dt.timedelta(seconds=attempt.grace_seconds or 0)


def preemption_finish(attempt_id: str, state: RayJobState | None) -> None:
    """Tear down the preempted attempt's cluster, then end it: ``preempted`` with the job back
    in the queue (or ``succeeded``, when its driver had finished before it was told to stop),
    and admit the job it made room for. Safe to call again."""
    attempt = load(attempt_id)
    if attempt.state not in ATTEMPT_ACTIVE:
        return
    now = timezone.now()
    JobAttempt.objects.filter(pk=attempt_id, finished_at__isnull=True).update(finished_at=now)
    attempt_teardown(attempt)
    job = attempt.job
    succeeded = state is not None and state.status == RAY_SUCCEEDED
    ended = attempt.finished_at or now
    lost = 0.0 if succeeded else preempted_gpu_seconds(job, attempt.running_at, ended)
    message = cluster_text.clean(state.message)[:4000] if state else ""
    with transaction.atomic():
        # The admission lock first, as a pass takes it: the requeue and the admission of the
        # job it made room for are one step no other pass can come between.
        lock_admission(job.organization_id)
        if not Job.objects.select_for_update().filter(pk=job.pk, state=JobState.PREEMPTING):
            return  # cancelled meanwhile: the cancel settles it
        updated = JobAttempt.objects.filter(pk=attempt_id, state__in=ATTEMPT_ACTIVE).update(
            state=AttemptState.SUCCEEDED if succeeded else AttemptState.PREEMPTED,
            failure_reason="" if succeeded else "preempted",
            ray_status=cluster_text.clean(state.status)[:16] if state else "",
            ray_message=message,
            exit_code=state.exit_code if state else None,
            preempted_gpu_seconds=lost,
        )
        if not updated:
            return
        data = {
            "attempt": attempt.number,
            "preempted_for": attempt.preempted_for_id,
            "grace_seconds": attempt.grace_seconds,
            "driver_exited": state is not None and state.status in RAY_TERMINAL,
            "gpu_seconds": lost,
        }
        if succeeded:
            moved = move_job(job.pk, JobState.SUCCEEDED, reason="", data=data)
        else:
            reason = f"preempted for job {attempt.preempted_for_id}; its grace period is over"
            moved = move_job(job.pk, JobState.QUEUED, kind="preempted", reason=reason, data=data)
        if moved is None:
            return
        transaction.on_commit(lambda: metrics_events.gpu_lost([moved], {job.pk: lost}), robust=True)
        if attempt.preempted_for_id:
            admit(job.organization_id, first=[attempt.preempted_for_id])
