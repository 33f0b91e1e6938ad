"""Running jobs: admission, launch, following, retries, deadlines, cancel and teardown.

Rows are the truth and every step is safe to run twice, from any worker:

* admission (``quotas/scheduler.py``) moves queued jobs that fit to ``launching`` and calls
  ``attempt_create`` for each.
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
import dataclasses
import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Iterator
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
from packages.models import URI_PREFIX as PACKAGE_URI_PREFIX
from packages.models import CodePackage, CodeSource
from packages.services import blob_name as package_blob
from packages.services import download_url as package_download_url
from packages.services import local_path as package_path
from packages.services import sha_of as package_sha
from packages.services import storage as package_storage
from packages.sources import CodeUnavailable
from packages.sources import fetch as fetch_code
from workspaces.compute_targets import compute_target_secrets
from workspaces.models import ComputeTarget, ComputeTargetKind

from .launchers import launcher_for, ray_jobs
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
from .models import ATTEMPT_ACTIVE, TERMINAL_STATES, AttemptState, Job, JobAttempt, JobState
from .state import InvalidTransition, record_event, transition

logger = logging.getLogger(__name__)
SYSTEM = Actor.system("worker")
LOG_ARCHIVE_LIMIT = 2_000_000  # characters kept of a driver log (its tail)


# --- compute targets ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ResolvedTarget:
    name: str
    kind: str
    config: dict[str, Any]


def resolve_target(job: Job) -> ResolvedTarget:
    """The workspace's compute target with its secret decrypted; ``local`` is built in."""
    name = job.workspace.compute_target
    target = ComputeTarget.objects.filter(organization_id=job.organization_id, name=name).first()
    if target is None:
        if name != ComputeTargetKind.LOCAL:
            raise LaunchError(f"compute target {name!r} does not exist in this organisation")
        return ResolvedTarget(name="local", kind="local", config=local_defaults({}))
    config = {**target.config, **compute_target_secrets(target)}
    if target.kind == ComputeTargetKind.LOCAL:
        config = local_defaults(config)
    # The operator's policy travels with the config: launchers check it at every connection.
    elif target.kind == ComputeTargetKind.RAY:
        config["allowed_networks"] = list(settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS)
    elif target.kind == ComputeTargetKind.KUBERAY:
        config["in_cluster_allowed"] = settings.MANTA_KUBERAY_IN_CLUSTER
    return ResolvedTarget(name=target.name, kind=target.kind, config=config)


def local_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A local target's config with the operator's settings; isolation is the operator's
    alone, whatever a tenant's target config holds."""
    from .local_host import sandbox_settings

    return {
        "work_dir": settings.MANTA_LOCAL_RAY_DIR,
        **config,
        "sandbox": sandbox_settings().to_config(),
    }


def cluster_name_for(job: Job, number: int) -> str:
    # DNS-safe and at most 47 characters (KubeRay's limit for a RayJob name).
    base = f"manta-{job.organization.slug}-{job.workspace.slug}"[:32].rstrip("-")
    return f"{base}-{job.pk}-{number}"


def launch_request(
    attempt: JobAttempt, target: ResolvedTarget, *, sign: bool = True
) -> LaunchRequest:
    """What the launcher starts. A cluster that downloads its code itself (kuberay) gets a
    short-lived signed link to the package (``sign=False`` for a plan: no working link shown)."""
    job = attempt.job
    # The job may want to know which run it is (e.g. to resume from a checkpoint on a retry).
    runtime_env = dict(job.spec.get("runtime_env") or {})
    runtime_env["env_vars"] = {
        **(runtime_env.get("env_vars") or {}),
        "MANTA_JOB_ID": str(job.pk),
        "MANTA_ATTEMPT": str(attempt.number),
    }
    if attempt.code_package:  # fetched from the job's code source
        runtime_env["working_dir"] = f"{PACKAGE_URI_PREFIX}{attempt.code_package}"
    packages = {}
    sha256 = package_sha(runtime_env.get("working_dir"))
    if sha256 and target.kind == ComputeTargetKind.KUBERAY:
        if sign:
            runtime_env["working_dir"] = package_download_url(sha256)
    elif sha256:
        packages[runtime_env["working_dir"]] = package_path(sha256)
    return LaunchRequest(
        submission_id=attempt.submission_id,
        cluster_name=attempt.cluster_name,
        packages=packages,
        spec={**job.spec, "runtime_env": runtime_env},
        labels={
            "manta.dev/org": job.organization.slug,
            "manta.dev/workspace": job.workspace.slug,
            "manta.dev/job": str(job.pk),
            "manta.dev/attempt": str(attempt.number),
        },
        target_config=target.config,
    )


def plan_for(job: Job) -> dict[str, Any]:
    """What the job's compute target launches (for the latest attempt, or the next one)."""
    attempt = job.attempts.order_by("-number").first()
    target = resolve_target(job)
    if attempt is None:
        attempt = JobAttempt(job=job, number=1, cluster_name=cluster_name_for(job, 1))
    request = launch_request(attempt, target, sign=False)
    return launcher_for(target.kind, target.config).plan(request)


# --- admission (quotas/scheduler.py decides; this creates the attempt) ----------------------


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
    """A launch killed after starting a cluster but before storing its handle left a cluster no
    row points to; it wrote its handle next to itself, so find it and stop it before retrying."""
    launcher = launcher_for(target.kind, target.config)
    for handle in launcher.find_clusters(target.config, submission_id=attempt.submission_id):
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


# --- the sweep ---------------------------------------------------------------------------------


def sweep() -> dict[str, int]:
    """Find work whose task was lost (a worker died) and enqueue it again."""
    from . import tasks

    now = timezone.now()
    stale = now - dt.timedelta(seconds=settings.MANTA_HEARTBEAT_STALE_SECONDS)
    counts = {"launch": 0, "follow": 0, "cancel": 0, "admit": 0}
    active = JobAttempt.objects.filter(state__in=ATTEMPT_ACTIVE).filter(
        Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True, created_at__lt=stale)
    )
    active = active.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    for attempt in active.select_related("job"):
        if attempt.job.state == JobState.CANCELLED:
            tasks.cancel_attempt.delay(str(attempt.pk))
            counts["cancel"] += 1
        elif not attempt.submitted:
            JobAttempt.objects.filter(pk=attempt.pk).update(heartbeat_at=now)
            tasks.launch_attempt.delay(str(attempt.pk))
            counts["launch"] += 1
        else:
            follow_start(str(attempt.pk))
            counts["follow"] += 1
    evictions = JobAttempt.objects.filter(
        state=AttemptState.PREEMPTED, torn_down_at__isnull=True, finished_at__lt=stale
    ).filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    counts["evict"] = 0
    for pk in evictions.values_list("pk", flat=True):
        tasks.evict_attempt.delay(str(pk))
        counts["evict"] += 1
    counts["strays"] = _stop_strays()
    if Job.objects.filter(state=JobState.QUEUED).exists():
        tasks.admit.delay()
        counts["admit"] += 1
    from quotas.services import budget_alerts, reconcile

    counts["budget_alerts"] = budget_alerts()
    counts["drift"] = sum(reconcile().values())
    return counts


def _stop_strays() -> int:
    """Stop the local clusters on this host whose attempt is gone or torn down (a launch
    killed after starting one, then its attempt ended): no cluster outlives its attempt,
    whatever was killed when. Returns how many were stopped."""
    config = {"work_dir": settings.MANTA_LOCAL_RAY_DIR}
    launcher = launcher_for(ComputeTargetKind.LOCAL, config)
    handles = launcher.find_clusters(config)
    ids = [i for h in handles if isinstance(i := h.get("submission_id"), str) and _is_uuid(i)]
    owned = JobAttempt.objects.filter(pk__in=ids, torn_down_at__isnull=True)
    owners = {str(pk) for pk in owned.values_list("pk", flat=True)}
    strays = [h for h in handles if h.get("submission_id") not in owners]
    for handle in strays:
        logger.warning("stopping local cluster %s: its attempt ended", handle.get("cluster_name"))
        launcher.stop(handle)
    return len(strays)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


# --- reads that need a launcher ----------------------------------------------------------------


FOLLOW_WAIT_SECONDS = 600  # how long a follower waits for a launch or for the archive


def job_log_stream(job: Job, *, number: int | None = None, since: int = 0) -> Iterator[str]:
    """The driver log of an attempt (the latest by default) from ``since`` on, as it grows,
    until the attempt ends: live from Ray chunk by chunk (nothing is read whole), then what
    the archive holds beyond it once written."""
    deadline = time.monotonic() + FOLLOW_WAIT_SECONDS
    attempts = job.attempts.order_by("-number")
    attempt = attempts.filter(number=number).first() if number else attempts.first()
    while attempt is None and number is None and time.monotonic() < deadline:
        # a job waiting for approval or admission: its first attempt's log is what comes next
        if Job.objects.filter(pk=job.pk, state__in=TERMINAL_STATES).exists():
            return
        time.sleep(0.5)
        attempt = attempts.first()
    if attempt is None:
        return
    while not attempt.submitted and attempt.state in ATTEMPT_ACTIVE:
        if time.monotonic() > deadline:
            return
        time.sleep(0.5)  # its cluster is starting
        attempt.refresh_from_db()
    position = 0
    if attempt.submitted and attempt.torn_down_at is None:
        target = resolve_target(job)
        launcher = launcher_for(target.kind, target.config)
        try:
            for chunk in launcher.follow_logs(handle_of(attempt)):
                fresh = chunk[max(0, since - position) :]
                position += len(chunk)
                if fresh:
                    yield fresh
        except LaunchError:
            pass  # the cluster went away: the archive has the rest
        while attempt.torn_down_at is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the end of the attempt writes the archive
            attempt.refresh_from_db()
    begin = max(position, since)
    text, start = attempt.log_archive, attempt.log_start
    if begin < start + len(text):
        yield text[max(0, begin - start) :]


def job_logs(
    job: Job, *, number: int | None = None, tail: int | None = None, since: int | None = None
) -> dict[str, Any]:
    """The driver log of an attempt (the latest by default): from Ray while its cluster is up
    (``live``), from Manta's copy once it is torn down (``archive``, written before the
    switch). While live, Manta's copy answers when Ray cannot, so lines never disappear.

    ``offset`` is where the text ends in the whole log; ``since`` (a previous answer's
    offset) returns only what came after it, so a follower never prints a line twice."""
    attempts = job.attempts.order_by("-number")
    attempt = attempts.filter(number=number).first() if number else attempts.first()
    if attempt is None:
        return {"attempt": None, "source": "none", "logs": "", "offset": 0}
    text, start, source = attempt.log_archive, attempt.log_start, "archive"
    if attempt.submitted and attempt.torn_down_at is None:
        source = "live"
        target = resolve_target(job)
        try:
            live = launcher_for(target.kind, target.config).logs(handle_of(attempt))
        except LaunchError:
            live = ""  # the cluster is not answering: Manta's copy is what there is
        if len(live) >= start + len(text):
            text, start = live, 0
    end = start + len(text)
    if since is not None:
        text = text[max(0, since - start) :] if since < end else ""
    elif tail:
        text = ray_jobs.tail_lines(text, tail)
    return {"attempt": attempt.number, "source": source, "logs": text, "offset": end}
