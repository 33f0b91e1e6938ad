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

from . import flavors
from .ledger import Claim, PastUsage, accrued
from .models import (
    RESOURCES,
    BudgetAlert,
    FairShareUsage,
    OrgQuota,
    Reservation,
    WorkspaceQuota,
)
from .selectors import half_life_seconds

ORG_FIELDS = [
    *RESOURCES,
    "max_running_jobs",
    "policy",
    "balanced_max_wait_seconds",
    "preemption",
    "gpu_flavors",
]
WS_FIELDS = (
    [f"guaranteed_{r}" for r in RESOURCES]
    + [f"limit_{r}" for r in RESOURCES]
    + ["max_running_jobs", "max_queued_jobs", "gpu_hours_per_month", "budget_action"]
    + ["fair_share_weight", "gpu_flavors"]
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


def _check_flavors(org_q: OrgQuota, ws_quotas: list[WorkspaceQuota]) -> None:
    """The GPU flavor quotas are well formed (``quotas/flavors.py``) and, per flavor, as for
    the totals: guaranteed ≤ limit ≤ capacity, Σ guaranteed ≤ capacity."""
    errors = flavors.org_capacity_problems(org_q.gpu_flavors)
    for quota in ws_quotas:
        errors = errors or flavors.workspace_quota_problems(quota.gpu_flavors)
    if not errors:
        errors = flavors.consistency_problems(
            org_q.gpu_flavors, [quota.gpu_flavors for quota in ws_quotas]
        )
    if errors:
        field, messages = next(iter(errors.items()))
        raise InvalidInput(f"{field}: {messages[0]}", errors=errors)


def _check_weight(quota: WorkspaceQuota) -> None:
    """A fair-share weight divides the workspace's share: 0 would divide by 0, and a negative
    weight would put the heaviest user first."""
    if not quota.fair_share_weight > 0:
        raise InvalidInput.on(
            "fair_share_weight", f"must be greater than 0, not {quota.fair_share_weight:g}"
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
        validate=lambda _: (
            _check_consistency(quota, ws_quotas),
            _check_flavors(quota, ws_quotas),
        ),
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
        validate=lambda _: (
            _check_weight(quota),
            _check_consistency(org_q, [*others, quota]),
            _check_flavors(org_q, [*others, quota]),
        ),
        full_clean=False,
        target_repr=f"quota of {workspace}",
        workspace=workspace,
    )
    return quota


def reservations_hold(
    claims: Iterable[Claim],
    *,
    organization_id: int,
    on_host: set[int],
    host: str,
    gpu_flavors: dict[int, str] | None = None,
) -> None:
    """Reserve what each admitted job asks for, in the caller's (admission) transaction; a
    workspace in ``on_host`` reserves on the shared host ``host`` as well. ``gpu_flavors``:
    the GPU flavor admission chose for each claim (by pk; untyped when absent)."""
    gpu_flavors = gpu_flavors or {}
    copy_insert(
        Reservation,
        (
            Reservation(
                job_id=claim.pk,
                organization_id=organization_id,
                workspace_id=claim.workspace_id,
                host=host if claim.workspace_id in on_host else "",
                gpu_flavor=gpu_flavors.get(claim.pk, ""),
                **claim.requested,
            )
            for claim in claims
        ),
    )


@transaction.atomic(savepoint=False)  # the caller's transaction; atomic for a bare call
def reservations_release(job_ids: list[int]) -> int:
    """Release what these jobs hold, in the caller's transaction, and fold what each held into
    its workspace's past usage (:func:`fair_share_usage_fold`). Returns how many rows.

    Exactly once: only a reservation still active is released and folded, and the rows are
    locked first, so a release repeated, or racing another, finds nothing left to fold."""
    now = timezone.now()
    active = Reservation.objects.select_for_update().filter(
        job_id__in=job_ids, released_at__isnull=True
    )
    rows = list(
        active.values_list("pk", "organization_id", "workspace_id", "created_at", *RESOURCES)
    )
    if not rows:
        return 0
    released = Reservation.objects.filter(
        pk__in=[row[0] for row in rows], released_at__isnull=True
    ).update(released_at=now)
    held: list[tuple[int, int, float, dict[str, float]]] = [
        (org_id, ws_id, (now - created).total_seconds(), dict(zip(RESOURCES, amounts, strict=True)))
        for _, org_id, ws_id, created, *amounts in rows
    ]
    fair_share_usage_fold(held, now=now)
    return released


def fair_share_usage_fold(
    held: list[tuple[int, int, float, dict[str, float]]], *, now: dt.datetime
) -> None:
    """Add ended holds — (organisation, workspace, seconds, amounts) — to their workspaces'
    decayed past usage as of ``now``: the stored amounts decay to ``now``, then each hold adds
    what it accrued (``quotas.ledger.accrued``). Three queries however many holds: create the
    rows that are missing (empty), lock them all in workspace order (two releases never wait
    for each other in a circle), write them back."""
    if not held:
        return
    half_life = half_life_seconds()
    added: dict[int, dict[str, float]] = {}
    org_of: dict[int, int] = {}
    for org_id, ws_id, seconds, amounts in held:
        org_of[ws_id] = org_id
        sums = added.setdefault(ws_id, dict.fromkeys(RESOURCES, 0.0))
        for name in RESOURCES:
            sums[name] += accrued(amounts[name], seconds, half_life)
    FairShareUsage.objects.bulk_create(
        [
            FairShareUsage(workspace_id=ws_id, organization_id=org_of[ws_id], as_of=now)
            for ws_id in added
        ],
        ignore_conflicts=True,  # a row another release created first is kept, and added to
    )
    rows = list(
        FairShareUsage.objects.select_for_update().filter(workspace_id__in=added).order_by("pk")
    )
    for row in rows:
        past = PastUsage({name: getattr(row, name) for name in RESOURCES}, row.as_of)
        for name, amount in past.at(now, half_life).items():
            setattr(row, name, amount + added[row.workspace_id][name])
        row.as_of = max(now, row.as_of)
    # Written back as an upsert of rows that all exist: one plain INSERT … ON CONFLICT DO
    # UPDATE, where bulk_update would build a CASE per row and field (ten times slower here).
    FairShareUsage.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["workspace"],
        update_fields=[*RESOURCES, "as_of"],
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
