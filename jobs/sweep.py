"""The sweep: find work whose task was lost (a worker died mid-step) and enqueue it again; stop
local clusters no attempt owns; check the quota invariants and budgets."""

from __future__ import annotations

import datetime as dt
import logging
import uuid

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from workspaces.models import ComputeTargetKind

from . import dispatch
from .accounting import budget_alerts, reconcile
from .following import follow_start
from .launchers import launcher_for
from .metrics_snapshot import snapshot_refresh
from .models import ATTEMPT_ACTIVE, AttemptState, Job, JobAttempt, JobState
from .pool_upkeep import WARM_PREFIX, pools_reconcile

logger = logging.getLogger(__name__)


def sweep() -> dict[str, int]:
    """Find work whose task was lost (a worker died) and enqueue it again."""
    now = timezone.now()
    stale = now - dt.timedelta(seconds=settings.MANTA_HEARTBEAT_STALE_SECONDS)
    counts = {"launch": 0, "follow": 0, "cancel": 0, "preempting": 0, "admit": 0}
    active = JobAttempt.objects.filter(state__in=ATTEMPT_ACTIVE).filter(
        Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True, created_at__lt=stale)
    )
    active = active.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    for attempt in active.select_related("job"):
        if attempt.job.state == JobState.CANCELLED:
            dispatch.send(dispatch.CANCEL, str(attempt.pk))
            counts["cancel"] += 1
        elif attempt.job.state == JobState.PREEMPTING:
            JobAttempt.objects.filter(pk=attempt.pk).update(heartbeat_at=now)
            dispatch.send(dispatch.PREEMPT, str(attempt.pk))
            counts["preempting"] += 1
        elif not attempt.submitted:
            JobAttempt.objects.filter(pk=attempt.pk).update(heartbeat_at=now)
            dispatch.send(dispatch.LAUNCH, str(attempt.pk))
            counts["launch"] += 1
        else:
            follow_start(str(attempt.pk))
            counts["follow"] += 1
    evictions = JobAttempt.objects.filter(
        state=AttemptState.PREEMPTED, torn_down_at__isnull=True, finished_at__lt=stale
    ).filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    counts["evict"] = 0
    for pk in evictions.values_list("pk", flat=True):
        dispatch.send(dispatch.EVICT, str(pk))
        counts["evict"] += 1
    counts["strays"] = _stop_strays()
    try:  # warm pools: a failure there must not stop the sweep's real work
        counts.update({f"warm_{k}": v for k, v in pools_reconcile().items()})
    except Exception:
        logger.exception("sweep: reconciling the warm pools failed")
    if Job.objects.filter(state=JobState.QUEUED).exists():
        dispatch.admit()
        counts["admit"] += 1
    counts["budget_alerts"] = budget_alerts()
    drift = reconcile()
    counts["drift"] = sum(drift.values())
    try:  # the levels /metrics reports; a failure here must not stop the sweep's real work
        snapshot_refresh(drift=drift)
    except Exception:
        logger.exception("sweep: taking the metrics snapshot failed")
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
    # A warm cluster no attempt has claimed is the pools' to reconcile (pool_upkeep).
    strays = [
        h
        for h in handles
        if h.get("submission_id") not in owners
        and not str(h.get("submission_id", "")).startswith(WARM_PREFIX)
    ]
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
