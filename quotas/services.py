"""Quota writes and the checks a submission must pass."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Sum
from django.utils import timezone
from rest_framework import status

from audit import services as audit
from audit.context import Actor
from config.errors import DomainError, InvalidInput
from outbox.services import event_emit
from workspaces.archive import require_active

from .models import RESOURCES, OrgQuota, Reservation, WorkspaceQuota

ORG_FIELDS = [
    "cpu",
    "memory_gb",
    "gpu",
    "max_running_jobs",
    "policy",
    "balanced_max_wait_seconds",
    "preemption",
]
WS_FIELDS = (
    [f"guaranteed_{r}" for r in RESOURCES]
    + [f"limit_{r}" for r in RESOURCES]
    + ["max_running_jobs", "max_queued_jobs", "gpu_hours_per_month", "budget_action"]
)


class BudgetExhausted(DomainError):
    type = "budget_exhausted"
    status_code = status.HTTP_409_CONFLICT


class QueueFull(DomainError):
    type = "queue_full"
    status_code = status.HTTP_429_TOO_MANY_REQUESTS


def org_quota(organization) -> OrgQuota:
    return OrgQuota.objects.filter(organization=organization).first() or OrgQuota(
        organization=organization
    )


def workspace_quota(workspace) -> WorkspaceQuota:
    return WorkspaceQuota.objects.filter(workspace=workspace).first() or WorkspaceQuota(
        workspace=workspace
    )


def _check_consistency(org_q: OrgQuota, ws_quotas: list[WorkspaceQuota]) -> None:
    """guaranteed ≤ limit ≤ capacity per workspace; Σ guaranteed ≤ capacity."""
    for name in RESOURCES:
        capacity = getattr(org_q, name)
        total = 0.0
        for q in ws_quotas:
            guaranteed, limit = getattr(q, f"guaranteed_{name}"), getattr(q, f"limit_{name}")
            total += guaranteed
            if limit is not None and guaranteed > limit:
                raise InvalidInput.on(
                    f"guaranteed_{name}", f"guaranteed {guaranteed:g} is above the limit {limit:g}"
                )
            if capacity is not None and limit is not None and limit > capacity:
                raise InvalidInput.on(
                    f"limit_{name}",
                    f"limit {limit:g} is above the organisation's capacity {capacity:g}",
                )
        if capacity is not None and total > capacity + 1e-9:
            raise InvalidInput.on(
                f"guaranteed_{name}" if ws_quotas else name,
                f"the workspaces' guarantees add up to {total:g}, above the capacity {capacity:g}",
            )


@transaction.atomic
def org_quota_update(*, actor: Actor, organization, data: dict[str, Any]) -> OrgQuota:
    quota, _ = OrgQuota.objects.select_for_update().get_or_create(organization=organization)
    ws_quotas = list(
        WorkspaceQuota.objects.filter(
            workspace__organization=organization, workspace__archived_at=None
        )
    )
    audit.model_update(
        instance=quota,
        fields=ORG_FIELDS,
        data=data,
        actor=actor,
        action="quota.update",
        validate=lambda _: _check_consistency(quota, ws_quotas),
        full_clean=False,
        target_repr=f"quota of {organization.slug}",
        organization=organization,
    )
    return quota


@transaction.atomic
def workspace_quota_update(*, actor: Actor, workspace, data: dict[str, Any]) -> WorkspaceQuota:
    require_active(workspace)
    org_q, _ = OrgQuota.objects.select_for_update().get_or_create(
        organization=workspace.organization
    )
    quota, _ = WorkspaceQuota.objects.select_for_update().get_or_create(workspace=workspace)
    others = list(
        WorkspaceQuota.objects.filter(
            workspace__organization=workspace.organization, workspace__archived_at=None
        ).exclude(pk=quota.pk)
    )
    audit.model_update(
        instance=quota,
        fields=WS_FIELDS,
        data=data,
        actor=actor,
        action="quota.update",
        validate=lambda _: _check_consistency(org_q, [*others, quota]),
        full_clean=False,
        target_repr=f"quota of {workspace}",
        workspace=workspace,
    )
    return quota


def budget_exceeded(
    quota: WorkspaceQuota | None,
    workspace,
    requested_gpu: float,
    max_runtime_seconds: float,
    used: float | None = None,
) -> str:
    """Why a GPU job would exceed the monthly budget ('' when it would not). A job may use up
    to requested GPUs × its max runtime."""
    if not quota or quota.gpu_hours_per_month is None or not requested_gpu:
        return ""
    used = gpu_hours(workspace, month_start()) if used is None else used
    worst = requested_gpu * max_runtime_seconds / 3600
    if used + worst <= quota.gpu_hours_per_month + 1e-9:
        return ""
    return (
        f"GPU budget {quota.gpu_hours_per_month:g} h/month: {used:g} h used, this job may "
        f"use up to {worst:g} h"
    )


def check_submission(
    workspace,
    requested: dict[str, float],
    spec: dict[str, Any],
    host_capacity: dict[str, float | None] | None = None,
) -> None:
    """Refuse a job that can never run here (over its workspace's limit, its organisation's
    capacity, or the capacity of the host it launches on), one the workspace's queue has no
    room for, or one over the GPU budget when the workspace refuses those (otherwise it waits
    for next month)."""
    org_q = OrgQuota.objects.filter(organization_id=workspace.organization_id).first()
    ws_q = WorkspaceQuota.objects.filter(workspace=workspace).first()
    for name in RESOURCES:
        need = requested[name]
        limit = getattr(ws_q, f"limit_{name}") if ws_q else None
        if limit is not None and need > limit:
            raise InvalidInput.on(
                f"requested.{name}",
                f"this job needs {need:g} {name}; the workspace limit is "
                f"{limit:g}, so it could never run",
            )
        capacity = getattr(org_q, name) if org_q else None
        if capacity is not None and need > capacity:
            raise InvalidInput.on(
                f"requested.{name}",
                f"this job needs {need:g} {name}; the organisation's capacity is "
                f"{capacity:g}, so it could never run",
            )
        on_host = (host_capacity or {}).get(name)
        if on_host is not None and need > on_host:
            raise InvalidInput.on(
                f"requested.{name}",
                f"this job needs {need:g} {name}; the host its workspace launches on has "
                f"{on_host:g}, so it could never run",
            )
    over = budget_exceeded(ws_q, workspace, requested["gpu"], spec["max_runtime_seconds"])
    if over and ws_q.budget_action == "refuse":
        raise BudgetExhausted(over, errors={"requested.gpu": [over]})
    if ws_q and ws_q.max_queued_jobs is not None:
        from jobs.models import Job, JobState

        waiting = Job.objects.filter(
            workspace=workspace, state__in=[JobState.PENDING_APPROVAL, JobState.QUEUED]
        ).count()
        if waiting >= ws_q.max_queued_jobs:
            raise QueueFull(
                f"the workspace already has {waiting} waiting jobs (max_queued_jobs "
                f"{ws_q.max_queued_jobs}); try again when some have started",
                errors={"max_queued_jobs": [str(ws_q.max_queued_jobs)]},
            )


def month_start(now: dt.datetime | None = None) -> dt.datetime:
    now = now or timezone.now()
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def gpu_hours(workspace, since: dt.datetime) -> float:
    """GPU-hours of the workspace's attempts since ``since``, from their real running time."""
    from jobs.models import JobAttempt

    now = timezone.now()
    total = 0.0
    attempts = (
        JobAttempt.objects.filter(
            job__workspace=workspace, running_at__isnull=False, job__requested_gpu__gt=0
        )
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
        .annotate(gpu=F("job__requested_gpu"))
    )
    for attempt in attempts:
        start = max(attempt.running_at, since)
        end = attempt.finished_at or now
        if end > start:
            total += (end - start).total_seconds() / 3600 * attempt.gpu
    return round(total, 4)


def usage(workspace) -> dict[str, Any]:
    from jobs.models import Job, JobState

    quota = workspace_quota(workspace)
    held = Reservation.objects.filter(workspace=workspace, released_at__isnull=True).aggregate(
        cpu=Sum("cpu"), memory_gb=Sum("memory_gb"), gpu=Sum("gpu"), jobs=Count("id")
    )
    counts = dict(
        Job.objects.filter(
            workspace=workspace,
            state__in=[
                JobState.QUEUED,
                JobState.PENDING_APPROVAL,
                JobState.LAUNCHING,
                JobState.RUNNING,
            ],
        )
        .values_list("state")
        .annotate(n=Count("id"))
    )
    return {
        "reserved": {name: held[name] or 0.0 for name in RESOURCES},
        "guaranteed": quota.guaranteed(),
        "limit": quota.limit(),
        "running": counts.get(JobState.RUNNING, 0) + counts.get(JobState.LAUNCHING, 0),
        "queued": counts.get(JobState.QUEUED, 0),
        "pending_approval": counts.get(JobState.PENDING_APPROVAL, 0),
        "gpu_hours_this_month": gpu_hours(workspace, month_start()),
        "gpu_hours_per_month": quota.gpu_hours_per_month,
    }


THRESHOLDS = (80, 100)


def budget_alerts() -> int:
    """Emit ``quota.threshold_reached`` once per workspace, month and threshold crossed."""
    from .models import BudgetAlert

    period = month_start()
    sent = 0
    for quota in WorkspaceQuota.objects.filter(gpu_hours_per_month__gt=0).select_related(
        "workspace__organization"
    ):
        used = gpu_hours(quota.workspace, period)
        percent = used / quota.gpu_hours_per_month * 100
        for threshold in THRESHOLDS:
            if percent < threshold:
                continue
            with transaction.atomic():
                _, created = BudgetAlert.objects.get_or_create(
                    workspace=quota.workspace,
                    period=period.date(),
                    threshold=threshold,
                    defaults={"used_gpu_hours": used},
                )
                if created:
                    event_emit(
                        type="quota.threshold_reached",
                        organization=quota.workspace.organization,
                        workspace=quota.workspace,
                        payload={
                            "workspace": quota.workspace.slug,
                            "threshold_percent": threshold,
                            "gpu_hours_used": used,
                            "gpu_hours_per_month": quota.gpu_hours_per_month,
                            "period": period.date().isoformat(),
                        },
                    )
                    sent += 1
    return sent


def reconcile() -> dict[str, int]:
    """Check the admission invariants and count every drift (0 everywhere when all holds):
    a reservation exists exactly for each launching/running job; reservations stay within each
    org's capacity and each workspace's limit; running jobs within the max-running limits."""
    import logging

    from jobs.models import ACTIVE_STATES, Job

    active = Reservation.objects.filter(released_at__isnull=True)
    drift = {
        "orphan_reservations": active.exclude(job__state__in=ACTIVE_STATES).count(),
        "missing_reservations": Job.objects.filter(state__in=ACTIVE_STATES)
        .filter(~Exists(active.filter(job=OuterRef("pk"))))
        .count(),
        "over_capacity": 0,
        "over_limit": 0,
        "over_running": 0,
    }
    for row in active.values("organization_id").annotate(
        cpu=Sum("cpu"), memory_gb=Sum("memory_gb"), gpu=Sum("gpu"), jobs=Count("id")
    ):
        quota = OrgQuota.objects.filter(organization_id=row["organization_id"]).first()
        if quota is None:
            continue
        for name in RESOURCES:
            cap = getattr(quota, name)
            drift["over_capacity"] += int(cap is not None and row[name] > cap + 1e-9)
        cap = quota.max_running_jobs
        drift["over_running"] += int(cap is not None and row["jobs"] > cap)
    limits = {q.workspace_id: q for q in WorkspaceQuota.objects.all()}
    for row in active.values("workspace_id").annotate(
        cpu=Sum("cpu"), memory_gb=Sum("memory_gb"), gpu=Sum("gpu"), jobs=Count("id")
    ):
        quota = limits.get(row["workspace_id"])
        if quota is None:
            continue
        for name in RESOURCES:
            limit = getattr(quota, f"limit_{name}")
            drift["over_limit"] += int(limit is not None and row[name] > limit + 1e-9)
        cap = quota.max_running_jobs
        drift["over_running"] += int(cap is not None and row["jobs"] > cap)
    if any(drift.values()):
        logging.getLogger(__name__).error("quota invariants drifted: %s", drift)
    return drift
