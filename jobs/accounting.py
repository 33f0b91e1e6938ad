"""What jobs use and hold, measured from their attempts: GPU-hours against budgets, a
workspace's usage, and the check that reservations match the jobs that hold them."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.utils import timezone

from quotas import selectors as quota_selectors
from quotas import services as quota_services
from quotas.flavors import flavor_budgets
from quotas.ledger import month_start
from quotas.models import WorkspaceQuota

from .models import ACTIVE_STATES, Job, JobAttempt, JobState

logger = logging.getLogger(__name__)

THRESHOLDS = (80, 100)  # percent of a GPU budget at which the workspace hears of it


def gpu_hours(workspace, since: dt.datetime) -> float:
    """GPU-hours of the workspace's attempts since ``since``, from their real running time."""
    return round(sum(_gpu_hours_by_flavor(workspace, since).values()), 4)


def gpu_hours_by_flavor(workspace, since: dt.datetime) -> dict[str, float]:
    """:func:`gpu_hours` by the GPU flavor each attempt ran on ("": untyped)."""
    return {f: round(h, 4) for f, h in _gpu_hours_by_flavor(workspace, since).items()}


def _gpu_hours_by_flavor(workspace, since: dt.datetime) -> dict[str, float]:
    now = timezone.now()
    totals: dict[str, float] = {}
    attempts = (
        JobAttempt.objects.filter(
            job__workspace=workspace, running_at__isnull=False, job__requested_gpu__gt=0
        )
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
        .values_list("running_at", "finished_at", "gpu_flavor", "job__requested_gpu")
    )
    for running_at, finished_at, flavor, gpu in attempts:
        start = max(running_at, since)
        end = finished_at or now
        if end > start:
            totals[flavor] = totals.get(flavor, 0.0) + (end - start).total_seconds() / 3600 * gpu
    return totals


def usage(workspace) -> dict[str, Any]:
    """What the workspace holds and runs, against its guarantees, limits and budget."""
    quota = quota_selectors.workspace_quota(workspace)
    counts = dict(
        Job.objects.filter(
            workspace=workspace,
            state__in=[
                JobState.QUEUED,
                JobState.PENDING_APPROVAL,
                JobState.LAUNCHING,
                JobState.RUNNING,
                JobState.PREEMPTING,
            ],
        )
        .values_list("state")
        .annotate(n=Count("id"))
    )
    period = month_start(timezone.now())
    return {
        "gpu_flavors": _flavor_usage(workspace, quota, period),
        "reserved": quota_selectors.reserved(workspace),
        "guaranteed": quota.guaranteed(),
        "limit": quota.limit(),
        "running": sum(counts.get(state, 0) for state in ACTIVE_STATES),
        "queued": counts.get(JobState.QUEUED, 0),
        "pending_approval": counts.get(JobState.PENDING_APPROVAL, 0),
        "gpu_hours_this_month": gpu_hours(workspace, month_start(timezone.now())),
        "gpu_hours_per_month": quota.gpu_hours_per_month,
        "preempted_gpu_hours_this_month": preempted_gpu_hours(
            workspace, month_start(timezone.now())
        ),
    }


def _flavor_usage(workspace, quota: WorkspaceQuota, period: dt.datetime) -> dict[str, Any]:
    """Per typed GPU flavor the workspace has a quota of, holds or used this period: what it
    holds, its guarantee and limit, its GPU-hours this period and its budget of them."""
    held = quota_selectors.reserved_by_flavor(workspace)
    used = gpu_hours_by_flavor(workspace, period)
    flavors = sorted({*quota.gpu_flavors, *held, *used} - {""})
    return {
        flavor: {
            "reserved": held.get(flavor, 0.0),
            "guaranteed": (quota.gpu_flavors.get(flavor) or {}).get("guaranteed", 0.0),
            "limit": (quota.gpu_flavors.get(flavor) or {}).get("limit"),
            "gpu_hours_this_month": used.get(flavor, 0.0),
            "gpu_hours_per_month": (quota.gpu_flavors.get(flavor) or {}).get("gpu_hours_per_month"),
        }
        for flavor in flavors
    }


def preempted_gpu_hours(workspace, since: dt.datetime) -> float:
    """GPU-hours the workspace's attempts preempted since ``since`` had run when they were
    stopped: the work preemption cost it (each attempt counted once, when it ended)."""
    total = JobAttempt.objects.filter(
        job__workspace=workspace, preempted_gpu_seconds__gt=0, finished_at__gte=since
    ).aggregate(seconds=Sum("preempted_gpu_seconds"))["seconds"]
    return round((total or 0.0) / 3600, 4)


def budget_alerts() -> int:
    """Emit ``quota.threshold_reached`` once per workspace, budget (the total, and each
    flavor's), month and threshold crossed."""
    period = month_start(timezone.now())
    sent = 0
    budgets = WorkspaceQuota.objects.filter(
        Q(gpu_hours_per_month__gt=0) | ~Q(gpu_flavors={})
    ).select_related("workspace__organization")
    for quota in budgets:
        flavored = {f: hours for f, hours in flavor_budgets(quota.gpu_flavors).items() if hours}
        if not flavored and not quota.gpu_hours_per_month:
            continue
        by_flavor = gpu_hours_by_flavor(quota.workspace, period)
        spent = {"": round(sum(by_flavor.values()), 4)} if quota.gpu_hours_per_month else {}
        spent.update({flavor: by_flavor.get(flavor, 0.0) for flavor in flavored})
        limits = {"": quota.gpu_hours_per_month, **flavored}
        for flavor, used in spent.items():
            percent = used / limits[flavor] * 100
            for threshold in THRESHOLDS:
                if percent >= threshold:
                    sent += quota_services.budget_alert_record(
                        quota, threshold=threshold, used=used, period=period, gpu_flavor=flavor
                    )
    return sent


def reconcile() -> dict[str, int]:
    """Check the admission invariants and count every drift (0 everywhere when all holds):
    a reservation exists exactly for each launching/running job; reservations stay within each
    org's capacity and each workspace's limit; running jobs within the max-running limits."""
    active = quota_selectors.active_reservations()
    drift = {
        "orphan_reservations": active.exclude(job__state__in=ACTIVE_STATES).count(),
        "missing_reservations": Job.objects.filter(state__in=ACTIVE_STATES)
        .filter(~Exists(active.filter(job=OuterRef("pk"))))
        .count(),
        **quota_selectors.drift_over_limits(),
    }
    if any(drift.values()):
        logger.error("quota invariants drifted: %s", drift)
    return drift
