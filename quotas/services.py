"""Quota writes, and holding and releasing reservations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit import services as audit
from audit.context import Actor
from config.db import copy_insert
from config.errors import InvalidInput
from outbox.services import event_emit
from workspaces.archive import require_active

from .ledger import Claim
from .models import RESOURCES, BudgetAlert, OrgQuota, Reservation, WorkspaceQuota

ORG_FIELDS = [
    *RESOURCES,
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


def reservations_hold(
    claims: Iterable[Claim], *, organization_id: int, on_host: set[int], host: str
) -> None:
    """Reserve what each admitted job asks for, in the caller's (admission) transaction; a
    workspace in ``on_host`` reserves on the shared host ``host`` as well."""
    copy_insert(
        Reservation,
        (
            Reservation(
                job_id=claim.pk,
                organization_id=organization_id,
                workspace_id=claim.workspace_id,
                host=host if claim.workspace_id in on_host else "",
                **claim.requested,
            )
            for claim in claims
        ),
    )


def reservations_release(job_ids: list[int]) -> int:
    """Release what these jobs hold, in the caller's transaction. Returns how many rows."""
    return Reservation.objects.filter(job_id__in=job_ids, released_at__isnull=True).update(
        released_at=timezone.now()
    )


def budget_alert_record(
    quota: WorkspaceQuota, *, threshold: int, used: float, period: dt.datetime
) -> bool:
    """Emit ``quota.threshold_reached`` for the workspace once per period and threshold: True
    when this call emitted it."""
    workspace = quota.workspace
    with transaction.atomic():
        _, created = BudgetAlert.objects.get_or_create(
            workspace=workspace,
            period=period.date(),
            threshold=threshold,
            defaults={"used_gpu_hours": used},
        )
        if created:
            event_emit(
                type="quota.threshold_reached",
                organization=workspace.organization,
                workspace=workspace,
                payload={
                    "workspace": workspace.slug,
                    "threshold_percent": threshold,
                    "gpu_hours_used": used,
                    "gpu_hours_per_month": quota.gpu_hours_per_month,
                    "period": period.date().isoformat(),
                },
            )
    return created
