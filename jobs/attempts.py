"""The attempt lifecycle: create, launch, follow, retry, enforce the deadline, cancel, preempt,
tear down. (What an attempt launches is ``launch_requests.py``; the sweep that restarts lost
work is ``sweep.py``; reading logs is ``logs.py``.)

Rows are the truth and every step is safe to run twice, from any worker:

* admission (``jobs/admission.py``) moves queued jobs that fit to ``launching`` and calls
  ``attempts_create`` for them.
* ``attempt_launch`` takes a short lease on the attempt (so duplicate tasks do not start two
  clusters), starts the cluster, stores the launcher's handle, then submits — a retried submit
  adopts the Ray job with the attempt's submission id, so an entrypoint never runs twice.
* ``attempt_follow`` polls Ray once, records a heartbeat, moves the job along, enforces the
  deadline and, at the end, archives the logs, tears the cluster down and settles the job
  (retrying on a fresh cluster while ``max_retries`` allows). It reschedules itself; the sweep
  restarts following for attempts whose heartbeat went stale (a worker died).

No database transaction is held while a launcher talks to Ray: slow calls happen between short
transactions, guarded by the lease and by the state machine's row lock.
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
from django.db.models.functions import Coalesce, Length
from django.utils import timezone

from audit.context import Actor
from config import secrets
from config.celery import send_many
from config.db import copy_insert
from packages.models import CodePackage, CodeSource
from packages.services import blob_name as package_blob
from packages.services import storage as package_storage
from packages.sources import CodeUnavailable
from packages.sources import fetch as fetch_code

from .launch_requests import ResolvedTarget, cluster_name_for, launch_request, resolve_target
from .launchers import launcher_for
from .launchers.base import (
    RAY_FAILED,
    RAY_RUNNING,
    RAY_STOPPED,
    RAY_SUCCEEDED,
    RAY_TERMINAL,
    LaunchAbandoned,
    LaunchError,
    LaunchRequest,
    NodeFailures,
    RayJobState,
)
from .models import ATTEMPT_ACTIVE, AttemptState, Job, JobAttempt, JobState
from .state import InvalidTransition, record_event, transition

logger = logging.getLogger(__name__)
SYSTEM = Actor.system("worker")
LOG_ARCHIVE_LIMIT = 2_000_000  # characters kept of a driver log (its tail)


# --- admission (jobs/admission.py decides; this creates the attempt) -------------------------


def attempts_create(jobs: list[Job]) -> list[JobAttempt]:
    """Move admitted queued jobs to ``launching``, each with its next attempt, in the caller's
    transaction; their launch tasks are sent when it commits."""
    if not jobs:
        return []
    previous = dict(
        JobAttempt.objects.filter(job__in=jobs).values_list("job").annotate(n=Count("id"))
    )
    numbers = {job.pk: previous.get(job.pk, 0) + 1 for job in jobs}
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
            )
            for job in locked
        ),
    )
    ids = [str(attempt.pk) for attempt in attempts]
    from . import tasks

    transaction.on_commit(lambda: tasks.launch_attempts(ids), robust=True)
    return attempts


def attempts_preempt(job_ids: list[int], *, reason: str, for_job: int) -> list[int]:
    """Send running jobs back to the queue to give capacity back to a workspace under its
    guarantee, in the caller's (admission) transaction: the jobs go to ``queued`` with a
    ``preempted`` event (their reservations are released by that move), their attempts end as
    ``preempted`` (so no launch or follow step acts on them again), and after commit their
    clusters are torn down. Jobs that ended meanwhile are left alone. Returns the preempted ids.
    """
    jobs = list(
        Job.objects.select_for_update(of=("self",))
        .filter(pk__in=job_ids, state__in=(JobState.LAUNCHING, JobState.RUNNING))
        .order_by("pk")
    )
    if not jobs:
        return []
    active = JobAttempt.objects.filter(job__in=jobs, state__in=ATTEMPT_ACTIVE)
    attempts = {job_id: (pk, n) for job_id, pk, n in active.values_list("job_id", "pk", "number")}
    transition(
        jobs,
        JobState.QUEUED,
        actor=SYSTEM,
        kind="preempted",
        reason=reason,
        data_by_job={
            job.pk: {"attempt": attempts.get(job.pk, (None, None))[1], "preempted_for": for_job}
            for job in jobs
        },
    )
    JobAttempt.objects.filter(pk__in=[pk for pk, _ in attempts.values()]).update(
        state=AttemptState.PREEMPTED,
        failure_reason="preempted",
        finished_at=Coalesce(F("finished_at"), Value(timezone.now())),
    )
    ids = [str(pk) for pk, _ in attempts.values()]
    from . import tasks

    transaction.on_commit(
        lambda: send_many(tasks.evict_attempt, [(pk,) for pk in ids]), robust=True
    )
    return [job.pk for job in jobs]


def attempt_evict(attempt_id: str) -> None:
    """Tear down the cluster of a preempted attempt. A launch still in progress holds the
    lease: wait for it (it stops a cluster it finds its attempt no longer wants)."""
    attempt = _load(attempt_id)
    if attempt.state != AttemptState.PREEMPTED or attempt.torn_down_at is not None:
        return
    with _leased(attempt_id, states=(AttemptState.PREEMPTED,)) as leased:
        if not leased:
            from . import tasks

            tasks.evict_attempt.apply_async((attempt_id,), countdown=2)
            return
        attempt_teardown(_load(attempt_id))


# --- launch ------------------------------------------------------------------------------------


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
def _leased(attempt_id: str, states=ATTEMPT_ACTIVE):
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


def _load(attempt_id: str) -> JobAttempt:
    return JobAttempt.objects.select_related("job__workspace", "job__organization").get(
        pk=attempt_id
    )


def handle_of(attempt: JobAttempt) -> dict[str, Any] | None:
    return secrets.decrypt_json(attempt.handle_encrypted) if attempt.handle_encrypted else None


def attempt_launch(attempt_id: str) -> None:
    """Bring the attempt's cluster up and submit its entrypoint; then hand over to following."""
    JobAttempt.objects.filter(pk=attempt_id, launch_started_at__isnull=True).update(
        launch_started_at=timezone.now()
    )
    with _leased(attempt_id) as leased:
        if not leased:
            return  # finished, or another worker is launching it
        attempt = _load(attempt_id)
        if attempt.job.state != JobState.LAUNCHING:
            return  # cancelled meanwhile: the cancel hook tears down
        try:
            _fetch_code(attempt)
            target = resolve_target(attempt.job)
            launcher = launcher_for(target.kind, target.config)
            request = launch_request(attempt, target)
            handle = handle_of(attempt)
            if handle is None:
                handle = _start(attempt, launcher, request, target)
            if not _still_wanted(attempt):
                return  # cancelled or preempted while the cluster came up: that path tears down
            launcher.submit(handle, request)
            now = timezone.now()
            JobAttempt.objects.filter(pk=attempt.pk).update(
                submitted=True,
                submitted_at=Coalesce(F("submitted_at"), Value(now)),
                heartbeat_at=now,
            )
        except LaunchAbandoned as exc:
            logger.info("launch of attempt %s stopped: %s", attempt_id, exc)
            return  # cancelled or preempted: that path ends the attempt
        except LaunchError as exc:
            logger.warning("launch of attempt %s failed: %s", attempt_id, exc)
            fail = RayJobState(RAY_FAILED, str(exc))
            attempt_settle(attempt_id, fail, reason="launch_failed")
            return
        except CodeUnavailable as exc:
            logger.warning("code of attempt %s unavailable: %s", attempt_id, exc)
            fail = RayJobState(RAY_FAILED, str(exc))
            attempt_settle(attempt_id, fail, reason="code_unavailable")
            return
    follow_start(attempt_id)


def _fetch_code(attempt: JobAttempt) -> None:
    """A job from a code source runs the commit its ref named when it first launched: fetched
    and packaged once, reused by its retries (fetched again by commit if the package expired)."""
    code = attempt.job.spec.get("code")
    if not code or attempt.code_package:
        return
    job = attempt.job
    earlier = (
        JobAttempt.objects.filter(job_id=job.pk, number__lt=attempt.number)
        .exclude(code_commit="")
        .order_by("-number")
        .first()
    )
    kept = earlier and CodePackage.objects.filter(
        workspace_id=job.workspace_id, sha256=earlier.code_package
    )
    if kept and package_storage().exists(package_blob(earlier.code_package)):
        commit, sha256 = earlier.code_commit, earlier.code_package
    else:
        source = CodeSource.objects.filter(workspace_id=job.workspace_id, name=code["source"])
        if not source.exists():
            raise CodeUnavailable(f"the code source {code['source']!r} no longer exists")
        ref = earlier.code_commit if earlier else code.get("ref") or source[0].default_ref
        fetched = fetch_code(source[0], ref, actor=SYSTEM)
        commit, sha256 = fetched.commit, fetched.package.sha256
    JobAttempt.objects.filter(pk=attempt.pk).update(code_commit=commit, code_package=sha256)
    attempt.code_commit, attempt.code_package = commit, sha256


def _still_wanted(attempt: JobAttempt) -> bool:
    """The attempt is active and its job is launching (a preempted job may be launching again,
    on a newer attempt)."""
    return JobAttempt.objects.filter(
        pk=attempt.pk, state__in=ATTEMPT_ACTIVE, job__state=JobState.LAUNCHING
    ).exists()


def _start(attempt: JobAttempt, launcher, request: LaunchRequest, target) -> dict[str, Any]:
    _stop_orphans(attempt, target)
    # Asked while nodes start: a cancel or preemption stops the start.
    handle = launcher.start_cluster(
        request,
        abandon=lambda: "" if _still_wanted(attempt) else "its attempt was cancelled or preempted",
    )
    now = timezone.now()
    updated = JobAttempt.objects.filter(pk=attempt.pk, state__in=ATTEMPT_ACTIVE).update(
        handle_encrypted=secrets.encrypt_json(handle),
        isolation=handle.get("isolation") or {"mode": f"{target.kind} target"},
        target_kind=target.kind,
        dashboard_url=handle.get("dashboard_url", ""),
        cluster_ready_at=now,
        heartbeat_at=now,
    )
    if not updated:  # cancelled while the cluster came up
        launcher.stop(handle)
        raise LaunchError("the attempt ended while its cluster was starting")
    return handle


def _stop_orphans(attempt: JobAttempt, target: ResolvedTarget) -> None:
    """A launch killed (or cancelled) after starting a cluster but before storing its handle
    left a cluster no row points to: find it from the attempt's request and stop it."""
    launcher = launcher_for(target.kind, target.config)
    for handle in launcher.find_started(launch_request(attempt, target, sign=False)):
        logger.warning("stopping orphaned cluster %s", handle.get("cluster_name"))
        launcher.stop(handle)


# --- following ---------------------------------------------------------------------------------


def follow_start(attempt_id: str) -> None:
    """(Re)start following: a new token makes any older follow chain stop at its next step."""
    JobAttempt.objects.filter(pk=attempt_id).update(
        follow_token=F("follow_token") + 1, heartbeat_at=timezone.now()
    )
    token = JobAttempt.objects.values_list("follow_token", flat=True).get(pk=attempt_id)
    from . import tasks

    transaction.on_commit(lambda: tasks.follow_attempt.delay(attempt_id, token), robust=True)


def attempt_follow(attempt_id: str, token: int) -> bool:
    """One step of following. Returns True when the caller should schedule another step."""
    attempt = _load(attempt_id)
    if attempt.follow_token != token or attempt.state not in ATTEMPT_ACTIVE:
        return False
    job = attempt.job
    if job.state not in (JobState.LAUNCHING, JobState.RUNNING):
        return False  # cancelled: the cancel hook tears down
    if not attempt.submitted:
        return False  # the launch task owns it until it is submitted
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
            return False
        return not _deadline_kept(attempt_id, attempt, job, now)
    now = timezone.now()
    JobAttempt.objects.filter(pk=attempt_id).update(
        heartbeat_at=now,
        ray_seen_at=now,
        ray_status=state.status,
        ray_message=state.message[:4000],
    )
    if state.status in RAY_TERMINAL:
        attempt_settle(attempt_id, state, reason=state.reason)
        return False
    _save_log_now_and_then(attempt, launcher, handle, now)
    try:
        _heal(attempt, launcher, handle)
    except NodeFailures as exc:
        attempt_settle(attempt_id, RayJobState(RAY_FAILED, str(exc)), reason="node_failures")
        return False
    if state.status == RAY_RUNNING and job.state == JobState.LAUNCHING:
        JobAttempt.objects.filter(pk=attempt_id).update(state=AttemptState.RUNNING, running_at=now)
        _move(job.pk, JobState.RUNNING, data={"attempt": attempt.number})
        attempt.running_at = now
    return not _deadline_kept(attempt_id, attempt, job, now)


def _save_log_now_and_then(attempt: JobAttempt, launcher, handle: dict[str, Any], now) -> None:
    """Copy the driver log to the attempt every MANTA_LOG_SAVE_SECONDS, so that logs/ has it
    whatever becomes of the cluster."""
    saved = attempt.log_saved_at
    if saved is not None and (now - saved).total_seconds() < settings.MANTA_LOG_SAVE_SECONDS:
        return
    with contextlib.suppress(LaunchError):  # Ray is not answering: the next step tries again
        _save_log(attempt.pk, launcher.logs(handle))


def _save_log(attempt_id, text: str) -> None:
    """Store the log's tail (at most LOG_ARCHIVE_LIMIT characters), never a shorter log than
    the one stored: what a follower has read stays readable."""
    kept = text[-LOG_ARCHIVE_LIMIT:]
    start = len(text) - len(kept)
    JobAttempt.objects.filter(pk=attempt_id).alias(
        stored_end=F("log_start") + Length("log_archive")
    ).filter(stored_end__lte=len(text)).update(
        log_archive=kept, log_start=start, log_saved_at=timezone.now()
    )


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


def _move(job_id: int, to_state: str, **kwargs) -> Job | None:
    """A transition the worker makes; losing a race to a user's cancel is not an error."""
    try:
        return transition(job_id, to_state, actor=SYSTEM, **kwargs)
    except InvalidTransition:
        return None


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
    attempt = _load(attempt_id)
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
    with transaction.atomic():
        updated = JobAttempt.objects.filter(pk=attempt_id, state__in=ATTEMPT_ACTIVE).update(
            state=attempt_state,
            failure_reason=failure,
            ray_status=state.status,
            ray_message=state.message[:4000],
            exit_code=state.exit_code,
        )
        if not updated:
            return
        message = state.message[:4000]
        data = {"attempt": attempt.number, "exit_code": state.exit_code, "message": message}

        def record(locked: Job) -> None:
            locked.failure_reason = "" if job_state == JobState.SUCCEEDED else failure
            locked.message = message

        if job_state == JobState.QUEUED:
            data["retry"] = f"{failures + 1} of {job.spec.get('max_retries', 0) + 1}"
            _move(job.pk, JobState.QUEUED, kind="retry", reason=failure, data=data)
        else:
            _move(job.pk, job_state, reason=failure, data=data, mutate=record)


def attempt_teardown(attempt: JobAttempt) -> None:
    """Archive the driver log and stop everything the attempt started. Idempotent."""
    handle = handle_of(attempt)
    if handle is None:
        # A launch killed before it stored the handle may have left a cluster behind.
        with contextlib.suppress(LaunchError):
            _stop_orphans(attempt, resolve_target(attempt.job))
        JobAttempt.objects.filter(pk=attempt.pk).update(torn_down_at=timezone.now())
        return
    target = resolve_target(attempt.job)
    launcher = launcher_for(target.kind, target.config)
    try:
        log = launcher.logs(handle)
    except LaunchError:
        log = None
    launcher.stop(handle)  # stops the Ray job; for local, the whole cluster
    _stop_orphans(attempt, target)
    if log is not None:
        _save_log(attempt.pk, log)
    # From now on logs/ reads the archive: it is written.
    JobAttempt.objects.filter(pk=attempt.pk).update(torn_down_at=timezone.now())


def job_cancelled(job_id: int) -> None:
    """After a cancel commits: end the active attempt (stop the Ray job, tear the cluster down)."""
    for attempt in JobAttempt.objects.filter(job_id=job_id, state__in=ATTEMPT_ACTIVE):
        from . import tasks

        tasks.cancel_attempt.delay(str(attempt.pk))


def attempt_cancel(attempt_id: str) -> None:
    attempt = _load(attempt_id)
    if attempt.state not in ATTEMPT_ACTIVE:
        return
    # Wait for a launch in progress to store its handle, so nothing it started is missed.
    with _leased(attempt_id) as leased:
        if not leased:
            from . import tasks

            tasks.cancel_attempt.apply_async((attempt_id,), countdown=2)
            return
        JobAttempt.objects.filter(pk=attempt_id, finished_at__isnull=True).update(
            finished_at=timezone.now()
        )
        attempt_teardown(_load(attempt_id))
        JobAttempt.objects.filter(pk=attempt_id, state__in=ATTEMPT_ACTIVE).update(
            state=AttemptState.CANCELLED, failure_reason="cancelled"
        )
