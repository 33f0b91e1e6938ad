"""Launching an attempt: take its lease, fetch its code, start its cluster, store the handle, then
submit — a retried submit adopts the Ray job with the attempt's submission id, so an entrypoint
never runs twice. A cancel or preemption during the start stops it."""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from config import secrets
from packages.models import CodePackage, CodeSource
from packages.services import blob_name as package_blob
from packages.services import storage as package_storage
from packages.sources import CodeUnavailable
from packages.sources import fetch as fetch_code

from . import metrics_events
from .attempts import SYSTEM, handle_of, leased, load, stop_orphans
from .following import attempt_settle, follow_start
from .launch_requests import launch_request, resolve_target
from .launchers import launcher_for
from .launchers.base import (
    RAY_FAILED,
    LaunchAbandoned,
    LaunchError,
    LaunchRequest,
    RayJobState,
)
from .models import ATTEMPT_ACTIVE, JobAttempt, JobState
from .pool_upkeep import warm_take

logger = logging.getLogger(__name__)


def attempt_launch(attempt_id: str) -> None:
    """Bring the attempt's cluster up and submit its entrypoint; then hand over to following."""
    JobAttempt.objects.filter(pk=attempt_id, launch_started_at__isnull=True).update(
        launch_started_at=timezone.now()
    )
    with leased(attempt_id) as held:
        if not held:
            return  # finished, or another worker is launching it
        attempt = load(attempt_id)
        if attempt.job.state != JobState.LAUNCHING:
            return  # cancelled meanwhile: the cancel hook tears down
        try:
            _fetch_code(attempt)
            target = resolve_target(attempt.job)
            launcher = launcher_for(target.kind, target.config)
            request = launch_request(attempt, target)
            handle = handle_of(attempt)
            if handle is None:
                with metrics_events.launch_phase(attempt.job, "cluster_start"):
                    handle = _start(attempt, launcher, request, target)
            if not _still_wanted(attempt):
                return  # cancelled or preempted while the cluster came up: that path tears down
            with metrics_events.launch_phase(attempt.job, "submit"):
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
    # A warm cluster of the job's shape when its pool has one idle; else a cold start.
    warm = warm_take(attempt, request, target.kind)
    if warm is not None:
        handle, cluster = warm
        isolation = handle.get("isolation") or {"mode": f"{target.kind} target"}
        isolation = {**isolation, "warm_cluster": cluster.pk}
    else:
        stop_orphans(attempt, target)
        # Asked while nodes start: a cancel or preemption stops the start.
        handle = launcher.start_cluster(
            request,
            abandon=lambda: (
                "" if _still_wanted(attempt) else "its attempt was cancelled or preempted"
            ),
        )
        isolation = handle.get("isolation") or {"mode": f"{target.kind} target"}
    now = timezone.now()
    updated = JobAttempt.objects.filter(pk=attempt.pk, state__in=ATTEMPT_ACTIVE).update(
        handle_encrypted=secrets.encrypt_json(handle),
        isolation=isolation,
        target_kind=target.kind,
        dashboard_url=handle.get("dashboard_url", ""),
        cluster_ready_at=now,
        heartbeat_at=now,
    )
    if not updated:  # cancelled while the cluster came up
        launcher.stop(handle)
        raise LaunchError("the attempt ended while its cluster was starting")
    return handle
