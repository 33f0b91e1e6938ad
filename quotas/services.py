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
from config.errors import Conflict, InvalidInput
from outbox.services import event_emit
from workspaces.archive import require_active

from . import flavors
from .ledger import Claim, PastUsage, accrued
from .models import (
    RESOURCES,
    BudgetAlert,
    FairShareUsage,
    OrgQuota,
    QueuePolicy,
    QuotaGroup,
    Reservation,
    WorkspaceQuota,
)
from .selectors import half_life_seconds
from .tree import check_tree

ORG_FIELDS = [
    *RESOURCES,
    "max_running_jobs",
    "policy",
    "balanced_max_wait_seconds",
    "preemption",
    "fair_share_preemption",
    "gpu_flavors",
]
WS_FIELDS = (
    [f"guaranteed_{r}" for r in RESOURCES]
    + [f"limit_{r}" for r in RESOURCES]
    + ["max_running_jobs", "max_queued_jobs", "gpu_hours_per_month", "budget_action"]
    + ["fair_share_weight", "gpu_flavors", "group_id"]
    + [f"lending_limit_{r}" for r in RESOURCES]
)
GROUP_FIELDS = (
    ["name", "parent_id"]
    + [f"guaranteed_{r}" for r in RESOURCES]
    + [f"limit_{r}" for r in RESOURCES]
    + [f"lending_limit_{r}" for r in RESOURCES]
    + ["max_running_jobs", "fair_share_weight", "gpu_flavors"]
)


def _check_consistency(
    org_q: OrgQuota, ws_quotas: list[WorkspaceQuota], groups: list[QuotaGroup] | None = None
) -> None:
    """The quota tree is one, and its numbers agree (``quotas.tree.check_tree``): guaranteed ≤
    limit ≤ the limit above; Σ guaranteed of a node's children ≤ its guarantee (the
    organisation's: its capacity)."""
    if groups is None:
        groups = list(QuotaGroup.objects.filter(organization_id=org_q.organization_id))
    check_tree(org_q.capacity(), groups, ws_quotas)


def _tree_rows(organization, *, lock: bool) -> tuple[OrgQuota, list[QuotaGroup]]:
    """The organisation's quota (locked first: every write to its tree takes it, so two
    writes are checked one after the other) and its groups."""
    org_q, _ = OrgQuota.objects.select_for_update().get_or_create(organization=organization)
    groups = QuotaGroup.objects.filter(organization=organization)
    return org_q, list(groups.select_for_update() if lock else groups)


def _check_flavors(
    org_q: OrgQuota, ws_quotas: list[WorkspaceQuota], groups: list[QuotaGroup] | None = None
) -> None:
    """The GPU flavor quotas are well formed (``quotas/flavors.py``) and, per flavor, as for
    the totals at every node of the tree: guaranteed ≤ limit ≤ the limit above, Σ guaranteed
    of a node's children ≤ its own (the organisation's: its capacity); a group's flavors
    within its totals."""
    if groups is None:
        groups = list(QuotaGroup.objects.filter(organization_id=org_q.organization_id))
    errors = flavors.org_capacity_problems(org_q.gpu_flavors)
    for group in groups:
        errors = errors or flavors.group_quota_problems(group.gpu_flavors)
    for quota in ws_quotas:
        errors = errors or flavors.workspace_quota_problems(quota.gpu_flavors)
    if not errors:
        errors = flavors.consistency_problems(org_q.gpu_flavors, ws_quotas, groups)
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


def _check_fair_preemption(quota: OrgQuota) -> None:
    """Fair-share preemption is a kind of preemption the fair_share policy makes: on without
    both, it would do nothing, and the organisation would think it does."""
    if quota.fair_share_preemption and not (
        quota.preemption and quota.policy == QueuePolicy.FAIR_SHARE
    ):
        raise InvalidInput.on(
            "fair_share_preemption",
            "needs policy fair_share and preemption true "
            f"(policy is {quota.policy}, preemption {str(quota.preemption).lower()})",
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
            _check_fair_preemption(quota),
        ),
        full_clean=False,
        target_repr=f"quota of {organization.slug}",
        organization=organization,
    )
    return quota


@transaction.atomic
def workspace_quota_update(*, actor: Actor, workspace, data: dict[str, Any]) -> WorkspaceQuota:
    require_active(workspace)
    org_q, groups = _tree_rows(workspace.organization, lock=False)
    quota, _ = WorkspaceQuota.objects.select_for_update().get_or_create(workspace=workspace)
    others = list(
        WorkspaceQuota.objects.filter(
            workspace__organization=workspace.organization, workspace__archived_at=None
        ).exclude(pk=quota.pk)
    )
    data = _with_node(data, "group", workspace.organization)
    audit.model_update(
        instance=quota,
        fields=WS_FIELDS,
        data=data,
        actor=actor,
        action="quota.update",
        validate=lambda _: (
            _check_weight(quota),
            _check_consistency(org_q, [*others, quota], groups),
            _check_flavors(org_q, [*others, quota], groups),
        ),
        full_clean=False,
        target_repr=f"quota of {workspace}",
        workspace=workspace,
    )
    return quota


def _with_node(data: dict[str, Any], field: str, organization) -> dict[str, Any]:
    """``data`` with the quota group given as ``field`` (a group or None) as its id, refused
    when it belongs to another organisation."""
    if field not in data:
        return data
    group = data[field]
    if group is not None and group.organization_id != organization.pk:
        raise InvalidInput.on(field, f"quota group '{group.name}' belongs to another organisation")
    rest = {key: value for key, value in data.items() if key != field}
    return {**rest, f"{field}_id": group.pk if group else None}


def _others(organization) -> list[WorkspaceQuota]:
    return list(
        WorkspaceQuota.objects.filter(
            workspace__organization=organization, workspace__archived_at=None
        )
    )


@transaction.atomic
def quota_group_create(*, actor: Actor, organization, data: dict[str, Any]) -> QuotaGroup:
    """Add a node to the organisation's quota tree (under ``parent``, or the organisation)."""
    org_q, groups = _tree_rows(organization, lock=True)
    data = _with_node(data, "parent", organization)
    if any(group.name == data.get("name") for group in groups):
        raise InvalidInput.on("name", f"the organisation has a quota group '{data['name']}'")
    group = QuotaGroup(organization=organization)
    for name in GROUP_FIELDS:
        if name in data:
            setattr(group, name, data[name])
    _check_group_weight(group)
    others = _others(organization)
    _check_consistency(org_q, others, [*groups, group])
    _check_flavors(org_q, others, [*groups, group])
    group.save()
    audit.record(
        actor=actor,
        action="quota_group.create",
        target=group,
        target_repr=f"quota group {group.name} of {organization.slug}",
        organization=organization,
        changes={name: [None, getattr(group, name)] for name in GROUP_FIELDS},
    )
    return group


@transaction.atomic
def quota_group_update(*, actor: Actor, group: QuotaGroup, data: dict[str, Any]) -> QuotaGroup:
    """Change a group's quota, name or parent (never under itself or its own subtree)."""
    organization = group.organization
    org_q, groups = _tree_rows(organization, lock=True)
    group = next(g for g in groups if g.pk == group.pk)
    data = _with_node(data, "parent", organization)
    name = data.get("name")
    if any(g.name == name and g.pk != group.pk for g in groups):
        raise InvalidInput.on("name", f"the organisation has a quota group '{name}'")
    others = _others(organization)
    audit.model_update(
        instance=group,
        fields=GROUP_FIELDS,
        data=data,
        actor=actor,
        action="quota_group.update",
        validate=lambda _: (
            _check_group_weight(group),
            _check_consistency(org_q, others, groups),
            _check_flavors(org_q, others, groups),
        ),
        full_clean=False,
        target_repr=f"quota group {group.name} of {organization.slug}",
        organization=organization,
    )
    return group


@transaction.atomic
def quota_group_delete(*, actor: Actor, group: QuotaGroup) -> None:
    """Remove an empty group: one with groups or workspaces under it is refused (409), never
    emptied by moving them elsewhere behind the admin's back."""
    organization = group.organization
    _tree_rows(organization, lock=True)
    children = QuotaGroup.objects.filter(parent=group).count()
    members = WorkspaceQuota.objects.filter(group=group).count()
    if children or members:
        raise Conflict(
            f"quota group '{group.name}' still has {children} group(s) and {members} "
            "workspace(s) under it: move or delete them first",
            errors={"group": [f"{children} group(s), {members} workspace(s) under it"]},
        )
    audit.record(
        actor=actor,
        action="quota_group.delete",
        target=group,
        target_repr=f"quota group {group.name} of {organization.slug}",
        organization=organization,
    )
    group.delete()


def _check_group_weight(group: QuotaGroup) -> None:
    if not group.fair_share_weight > 0:
        raise InvalidInput.on(
            "fair_share_weight", f"must be greater than 0, not {group.fair_share_weight:g}"
        )


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
    quota: WorkspaceQuota,
    *,
    threshold: int,
    used: float,
    period: dt.datetime,
    gpu_flavor: str = "",
) -> bool:
    """Emit ``quota.threshold_reached`` for the workspace once per period, budget (its total:
    ``gpu_flavor`` "", or that flavor's) and threshold: True when this call emitted it."""
    workspace = quota.workspace
    budget = (
        quota.gpu_flavors[gpu_flavor]["gpu_hours_per_month"]
        if gpu_flavor
        else quota.gpu_hours_per_month
    )
    with transaction.atomic():
        _, created = BudgetAlert.objects.get_or_create(
            workspace=workspace,
            gpu_flavor=gpu_flavor,
            period=period.date(),
            threshold=threshold,
            defaults={"used_gpu_hours": used},
        )
        if created:
            payload = {
                "workspace": workspace.slug,
                "threshold_percent": threshold,
                "gpu_hours_used": used,
                "gpu_hours_per_month": budget,
                "period": period.date().isoformat(),
            }
            if gpu_flavor:
                payload["gpu_flavor"] = gpu_flavor
            event_emit(
                type="quota.threshold_reached",
                organization=workspace.organization,
                workspace=workspace,
                payload=payload,
            )
    return created
