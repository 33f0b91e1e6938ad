"""Quota writes and the checks a submission must pass."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone
from rest_framework import status

from audit import services as audit
from audit.context import Actor
from config.errors import DomainError, InvalidInput

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


def _update(instance, fields: list[str], data: dict[str, Any]) -> dict[str, list]:
    before = audit.snapshot(instance, fields)
    for field in fields:
        if field in data:
            setattr(instance, field, data[field])
    return audit.diff(instance, before, fields)


@transaction.atomic
def org_quota_update(*, actor: Actor, organization, data: dict[str, Any]) -> OrgQuota:
    quota, _ = OrgQuota.objects.select_for_update().get_or_create(organization=organization)
    changes = _update(quota, ORG_FIELDS, data)
    ws_quotas = list(
        WorkspaceQuota.objects.filter(
            workspace__organization=organization, workspace__archived_at=None
        )
    )
    _check_consistency(quota, ws_quotas)
    _save(actor, quota, changes, f"quota of {organization.slug}", organization=organization)
    return quota


@transaction.atomic
def workspace_quota_update(*, actor: Actor, workspace, data: dict[str, Any]) -> WorkspaceQuota:
    org_q, _ = OrgQuota.objects.select_for_update().get_or_create(
        organization=workspace.organization
    )
    quota, _ = WorkspaceQuota.objects.select_for_update().get_or_create(workspace=workspace)
    changes = _update(quota, WS_FIELDS, data)
    others = list(
        WorkspaceQuota.objects.filter(
            workspace__organization=workspace.organization, workspace__archived_at=None
        ).exclude(pk=quota.pk)
    )
    _check_consistency(org_q, [*others, quota])
    _save(actor, quota, changes, f"quota of {workspace}", workspace=workspace)
    return quota


def _save(actor: Actor, quota, changes: dict[str, list], label: str, **scope) -> None:
    if changes:
        quota.save()
        audit.record(
            actor=actor,
            action="quota.update",
            target=quota,
            target_repr=label,
            changes=changes,
            **scope,
        )


def check_submission(workspace, requested: dict[str, float]) -> None:
    """Refuse a job that can never run here, or one the workspace's queue has no room for."""
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
