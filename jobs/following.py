"""Following an attempt to its end: poll Ray once per step, record a heartbeat, move the job along,
bring back dead nodes, enforce the deadline and, at the end, archive the logs, tear the cluster
down and settle the job (retrying on a fresh cluster while ``max_retries`` allows). A follow step
reschedules itself; the sweep restarts following for attempts whose heartbeat went stale (a
worker died). Cancelled and preempted attempts are torn down here too.

What a cluster says is the job's to choose (its log, Ray's message): it enters the database
only through ``cluster_text.clean``, and a part of a step that fails on it (or on anything
else) is logged without stopping the others: the deadline, cancel and teardown always run."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from config import secrets

from . import dispatch
from .attempts import SYSTEM, handle_of, leased, load, move_job, stop_orphans
from .launch_requests import resolve_target
from .launchers import cluster_text, launcher_for
from .launchers.base import (
    RAY_FAILED,
    RAY_RUNNING,
    RAY_STOPPED,
    RAY_SUCCEEDED,
    RAY_TERMINAL,
    LaunchError,
    NodeFailures,
    RayJobState,
)
from .log_archive import log_archive_save
from .models import ATTEMPT_ACTIVE, AttemptState, Job, JobAttempt, JobState
from .state import record_event

logger = logging.getLogger(__name__)


# --- following ---------------------------------------------------------------------------------


def follow_start(attempt_id: str) -> None:
    """(Re)start following: a new token makes any older follow chain stop at its next step."""
    JobAttempt.objects.filter(pk=attempt_id).update(
        follow_token=F("follow_token") + 1, heartbeat_at=timezone.now()
    )
    token = JobAttempt.objects.values_list("follow_token", flat=True).get(pk=attempt_id)
    dispatch.on_commit(dispatch.FOLLOW, attempt_id, token)


def attempt_follow(attempt_id: str, token: int) -> float | None:
    """One step of following. Returns the seconds until the next step (``next_step_in``), or
    None when following is over.

    Its parts (recording Ray's answer, saving the log, healing, the move to running, the
    deadline) stand on their own: one that raises is logged and the others still run."""
    attempt = load(attempt_id)
    if attempt.follow_token != token or attempt.state not in ATTEMPT_ACTIVE:
        return None
    job = attempt.job
    if job.state not in (JobState.LAUNCHING, JobState.RUNNING):
        return None  # cancelled: the cancel hook tears down
    if not attempt.submitted:
        return None  # the launch task owns it until it is submitted
    target = resolve_target(job)
    launcher = launcher_for(target.kind, target.config)
    handle = handle_of(attempt)
    try:
        state = launcher.status(handle)
    except LaunchError as exc:
        # The follower is alive (heartbeat) even when Ray is not: the sweep leaves it be, and
        # the time since Ray last answered, not since the last follow step, decides the loss.
        now = timezone.now()
        JobAttempt.objects.filter(pk=attempt_id).update(heartbeat_at=now)
        seen = attempt.ray_seen_at or attempt.submitted_at or attempt.created_at
        if (now - seen).total_seconds() > settings.MANTA_CLUSTER_LOST_SECONDS:
            attempt_settle(attempt_id, RayJobState(RAY_FAILED, str(exc)), reason="cluster_lost")
            return None
        return None if _deadline_kept(attempt_id, attempt, job, now) else next_step_in(None)
    now = timezone.now()
    _part(attempt, "recording Ray's answer", lambda: _record_answer(attempt_id, state, now))
    if state.status in RAY_TERMINAL:
        attempt_settle(attempt_id, state, reason=state.reason)
        return None
    _part(attempt, "saving the log", lambda: _save_log_now_and_then(attempt, launcher, handle, now))
    try:
        _heal(attempt, launcher, handle)
    except NodeFailures as exc:
        attempt_settle(attempt_id, RayJobState(RAY_FAILED, str(exc)), reason="node_failures")
        return None
    except Exception:
        logger.exception("Following attempt %s: healing its cluster failed", attempt_id)
    launching_for = None
    if job.state == JobState.LAUNCHING:
        if state.status == RAY_RUNNING:
            _part(attempt, "moving the job to running", lambda: _mark_running(attempt, now))
        else:
            submitted = attempt.submitted_at or now
            launching_for = max(0.0, (now - submitted).total_seconds())
    return None if _deadline_kept(attempt_id, attempt, job, now) else next_step_in(launching_for)


def next_step_in(launching_for: float | None) -> float:
    """The wait before the next follow step: MANTA_FOLLOW_INTERVAL_SECONDS once the job runs.
    Before that (``launching_for``: seconds since it was submitted to Ray, whose driver starts
    a second or two later) a tenth of that time, from 0.1 s: the move to running is seen within
    ~10 % of the wait for it, and a driver slow to start is not asked after ten times a second
    for long (about 35 steps in its first 10 s, then the interval)."""
    interval = settings.MANTA_FOLLOW_INTERVAL_SECONDS
    if launching_for is None:
        return interval
    return min(interval, max(0.1, launching_for / 10))


def _part(attempt: JobAttempt, what: str, call) -> None:
    """Run one part of a follow step; when it raises, log it and let the step go on."""
    try:
        call()
    except Exception:
        logger.exception("Following attempt %s: %s failed", attempt.pk, what)


def _record_answer(attempt_id: str, state: RayJobState, now) -> None:
    """The heartbeat, and what Ray said (cleaned: the job chooses the message)."""
    with transaction.atomic():  # a refused write must not spoil the caller's transaction
        JobAttempt.objects.filter(pk=attempt_id).update(
            heartbeat_at=now,
            ray_seen_at=now,
            ray_status=cluster_text.clean(state.status)[:16],
            ray_message=cluster_text.clean(state.message)[:4000],
        )


def _mark_running(attempt: JobAttempt, now) -> None:
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.RUNNING, running_at=now)
    move_job(attempt.job_id, JobState.RUNNING, data={"attempt": attempt.number})
    attempt.running_at = now


def _save_log_now_and_then(attempt: JobAttempt, launcher, handle: dict[str, Any], now) -> None:
    """Copy the end of the driver log (MANTA_LOG_ARCHIVE_BYTES of it, and only that much is
    read) to the attempt every MANTA_LOG_SAVE_SECONDS, so that logs/ has it whatever becomes
    of the cluster."""
    saved = attempt.log_saved_at
    if saved is not None and (now - saved).total_seconds() < settings.MANTA_LOG_SAVE_SECONDS:
        return
    with contextlib.suppress(LaunchError):  # Ray is not answering: the next step tries again
        part = launcher.log_part(handle, limit=settings.MANTA_LOG_ARCHIVE_BYTES)
        log_archive_save(attempt.pk, part)


def _heal(attempt: JobAttempt, launcher, handle: dict[str, Any]) -> None:
    """Start the cluster's dead worker nodes again, store the new handle, and say so on the
    job's timeline (``node_restarted``) and as a ``job.node_restarted`` event."""
    restarted = launcher.heal(handle, max_restarts=settings.MANTA_NODE_RESTARTS)
    if not restarted:
        return
    # The new handle first, on its own: whatever fails after, no step restarts the node again.
    JobAttempt.objects.filter(pk=attempt.pk).update(handle_encrypted=secrets.encrypt_json(handle))
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("workspace", "organization")
        job = job.get(pk=attempt.job_id)
        for node in restarted:
            record_event(
                job,
                from_state=job.state,
                kind="node_restarted",
                actor=SYSTEM,
                reason=f"Ray worker node {node['name']} ({node.get('group')}) died and was "
                f"started again ({node['restarts']} of {settings.MANTA_NODE_RESTARTS})",
                data={
                    "attempt": attempt.number,
                    "node": node["name"],
                    "group": node.get("group"),
                    "restarts": node["restarts"],
                },
                audit_action="job.node_restarted",
                changes={"restarts": [node["restarts"] - 1, node["restarts"]]},
            )


def _deadline_kept(attempt_id: str, attempt: JobAttempt, job: Job, now) -> bool:
    """Stop the attempt if it ran past max_runtime_seconds, by Manta's clock whatever Ray
    answers (or fails to). True when it was stopped."""
    deadline_from = attempt.running_at or attempt.submitted_at or attempt.created_at
    limit = job.spec.get("max_runtime_seconds") or 0
    if limit and (now - deadline_from).total_seconds() > limit:
        message = f"stopped after exceeding max_runtime_seconds={limit}"
        attempt_settle(attempt_id, RayJobState(RAY_STOPPED, message), reason="deadline_exceeded")
        return True
    return False


# --- the end of an attempt ---------------------------------------------------------------------


RETRYABLE = frozenset(
    {
        "entrypoint_failed",
        "launch_failed",
        "cluster_lost",
        "node_failures",
        "stopped",
        "code_unavailable",
    }
)


def attempt_settle(attempt_id: str, state: RayJobState, *, reason: str = "") -> None:
    """Archive the logs, tear the cluster down, and settle the job: succeeded, or failed (or
    retried on a fresh cluster while ``max_retries`` allows). Safe to call again."""
    attempt = load(attempt_id)
    if attempt.state not in ATTEMPT_ACTIVE:
        return
    # The attempt's run ends now; tearing the cluster down is a phase of its own.
    JobAttempt.objects.filter(pk=attempt_id, finished_at__isnull=True).update(
        finished_at=timezone.now()
    )
    attempt_teardown(attempt)
    job = attempt.job
    if state.status == RAY_SUCCEEDED and not reason:
        attempt_state, job_state, failure = AttemptState.SUCCEEDED, JobState.SUCCEEDED, ""
    else:
        failure = reason or ("stopped" if state.status == RAY_STOPPED else "entrypoint_failed")
        attempt_state = AttemptState.FAILED
        # Runs that failed, this one included (a preempted run is not the job's fault).
        failures = 1 + JobAttempt.objects.filter(job=job, state=AttemptState.FAILED).count()
        retries_left = failures <= job.spec.get("max_retries", 0)
        job_state = JobState.QUEUED if retries_left and failure in RETRYABLE else JobState.FAILED
    message = cluster_text.clean(state.message)[:4000]
    with transaction.atomic():
        updated = JobAttempt.objects.filter(pk=attempt_id, state__in=ATTEMPT_ACTIVE).update(
            state=attempt_state,
            failure_reason=failure,
            ray_status=cluster_text.clean(state.status)[:16],
            ray_message=message,
            exit_code=state.exit_code,
        )
        if not updated:
            return
        data = {"attempt": attempt.number, "exit_code": state.exit_code, "message": message}

        def record(locked: Job) -> None:
            locked.failure_reason = "" if job_state == JobState.SUCCEEDED else failure
            locked.message = message

        if job_state == JobState.QUEUED:
            data["retry"] = f"{failures + 1} of {job.spec.get('max_retries', 0) + 1}"
            move_job(job.pk, JobState.QUEUED, kind="retry", reason=failure, data=data)
        else:
            move_job(job.pk, job_state, reason=failure, data=data, mutate=record)


def attempt_teardown(attempt: JobAttempt) -> None:
    """Archive the driver log and stop everything the attempt started. Idempotent. The cluster
    is stopped, and the attempt marked torn down, whether or not the log could be read or
    stored."""
    handle = handle_of(attempt)
    if handle is None:
        # A launch killed before it stored the handle may have left a cluster behind.
        with contextlib.suppress(LaunchError):
            stop_orphans(attempt, resolve_target(attempt.job))
        JobAttempt.objects.filter(pk=attempt.pk).update(torn_down_at=timezone.now())
        return
    target = resolve_target(attempt.job)
    launcher = launcher_for(target.kind, target.config)
    try:
        log = launcher.log_part(handle, limit=settings.MANTA_LOG_ARCHIVE_BYTES)
    except LaunchError:
        log = None
    except Exception:
        logger.exception("Reading the log of attempt %s failed; tearing down", attempt.pk)
        log = None
    if log is not None:
        # Before the cluster goes: until torn_down_at is set, logs/ reads the cluster and
        # falls back on this copy, so the copy must already hold what the cluster held.
        try:
            log_archive_save(attempt.pk, log)
        except Exception:
            logger.exception("Archiving the log of attempt %s failed", attempt.pk)
    launcher.stop(handle)  # stops the Ray job; for local, the whole cluster
    stop_orphans(attempt, target)
    # From now on logs/ reads the archive: it is written.
    JobAttempt.objects.filter(pk=attempt.pk).update(torn_down_at=timezone.now())


def attempt_cancel(attempt_id: str) -> None:
    attempt = load(attempt_id)
    if attempt.state not in ATTEMPT_ACTIVE:
        return
    # Wait for a launch in progress to store its handle, so nothing it started is missed.
    with leased(attempt_id) as held:
        if not held:
            dispatch.send(dispatch.CANCEL, attempt_id, countdown=2)
            return
        JobAttempt.objects.filter(pk=attempt_id, finished_at__isnull=True).update(
            finished_at=timezone.now()
        )
        attempt_teardown(load(attempt_id))
        JobAttempt.objects.filter(pk=attempt_id, state__in=ATTEMPT_ACTIVE).update(
            state=AttemptState.CANCELLED, failure_reason="cancelled"
        )


def attempt_evict(attempt_id: str) -> None:
    """Tear down the cluster of a preempted attempt. A launch still in progress holds the
    lease: wait for it (it stops a cluster it finds its attempt no longer wants)."""
    attempt = load(attempt_id)
    if attempt.state != AttemptState.PREEMPTED or attempt.torn_down_at is not None:
        return
    with leased(attempt_id, states=(AttemptState.PREEMPTED,)) as held:
        if not held:
            dispatch.send(dispatch.EVICT, attempt_id, countdown=2)
            return
        attempt_teardown(load(attempt_id))
