"""Which GPU flavors each workspace's jobs can get: the pool of GPUs its compute target offers
(``quotas.flavors.Pool``). The local host's is its typed inventory (``MANTA_LOCAL_GPUS``),
shared by every organisation; a ``kuberay`` target's is the ``gpu_flavors`` its config
declares, this organisation's alone; any other target's is the untyped ``gpu``."""

from __future__ import annotations

import dataclasses
from typing import Any

from config.errors import InvalidInput
from config.gpu_flavors import UNTYPED
from quotas.flavors import UNTYPED_POOL, FlavorBook, Pool, StaticPaths
from quotas.models import OrgQuota, QuotaGroup, WorkspaceQuota
from workspaces.models import ComputeTarget, ComputeTargetKind, Workspace

from .local_host import HOST, compute_target_of, gpu_flavor_inventory, workspaces_on_host


def host_pool() -> Pool:
    """This host's GPUs by flavor (uncapped untyped ones when it has no inventory: its GPUs
    are logical then)."""
    inventory = gpu_flavor_inventory()
    flavors = {flavor: float(len(devices)) for flavor, devices in inventory.items()}
    return Pool(f"host:{HOST}", "this host", flavors or {UNTYPED: None})


def target_pool(target: ComputeTarget) -> Pool:
    """What a target's config declares (``{"h100": {"count": 8, ...}}``), in name order (the
    database keeps no order of JSON keys)."""
    declared = (target.config or {}).get("gpu_flavors") or {}
    if target.kind != ComputeTargetKind.KUBERAY or not declared:
        return UNTYPED_POOL
    return Pool(
        f"target:{target.organization_id}:{target.name}",
        f"compute target {target.name}",
        {name: float(declared[name]["count"]) for name in sorted(declared)},
    )


def gpu_pools(organization_id: int, on_host: set[int] | None = None) -> dict[int, Pool]:
    """Each of the organisation's workspaces' pools (``on_host``: its workspaces on this host,
    when the caller has them); a workspace on an untyped target may be left out. One query,
    and one more when a kuberay target of the organisation declares flavors."""
    on_host = workspaces_on_host(organization_id) if on_host is None else on_host
    host = host_pool()
    pools: dict[int, Pool] = dict.fromkeys(on_host, host)
    targets = {
        target.name: target
        for target in ComputeTarget.objects.filter(
            organization_id=organization_id, kind=ComputeTargetKind.KUBERAY
        )
        if (target.config or {}).get("gpu_flavors")
    }
    if targets:
        workspaces = Workspace.objects.filter(
            organization_id=organization_id, compute_target__in=targets
        ).exclude(pk__in=on_host)
        for ws_id, name in workspaces.values_list("pk", "compute_target"):
            pools[ws_id] = target_pool(targets[name])
    return pools


def gpu_pool_of(workspace: Workspace, *, on_host: bool) -> Pool:
    """One workspace's pool (``on_host``: it launches on this host)."""
    if on_host:
        return host_pool()
    target = compute_target_of(workspace)
    return target_pool(target) if target is not None else UNTYPED_POOL


def check_flavors(
    workspace: Workspace,
    requested: dict[str, float],
    spec: dict[str, Any],
    org_q: OrgQuota,
    ws_q: WorkspaceQuota,
    *,
    on_host: bool,
    above: list[QuotaGroup] = (),
) -> tuple[FlavorBook, SubmittedClaim]:
    """Refuse a GPU job none of whose acceptable flavors could ever fit: its target has none
    of them, or it needs more of each than a limit or capacity of that flavor allows (the
    workspace's, a quota group's above it (``above``, nearest first), the organisation's).
    Returns the book and the claim, for :func:`flavor_budget_overrun`."""
    claim = SubmittedClaim(
        workspace.pk,
        requested,
        tuple(spec.get("gpu_flavor") or ()),
        max_runtime_seconds=spec.get("max_runtime_seconds") or 0,
    )
    book = FlavorBook(
        org_capacity=dict(org_q.gpu_flavors or {}),
        ws_quotas={workspace.pk: dict(ws_q.gpu_flavors or {})},
        pools={workspace.pk: gpu_pool_of(workspace, on_host=on_host)},
        groups={group.pk: group for group in above},
        tree=StaticPaths({workspace.pk: tuple(group.pk for group in above)}),
    )
    reasons = [book.never_fits(claim, flavor) for flavor in book.candidates(claim)]
    if all(reasons):
        field = "gpu_flavor" if claim.gpu_flavors else "requested.gpu"
        raise InvalidInput.on(field, "; ".join(reasons))
    return book, claim


def flavor_budget_overrun(book: FlavorBook, claim: SubmittedClaim) -> str:
    """Why every flavor the submitted job could run on is over its workspace's budget of it
    ('' when one is within its budget, or has none)."""
    reasons = []
    for flavor in book.candidates(claim):
        if book.never_fits(claim, flavor):
            continue
        reason = book.over_budget(claim, flavor)
        if not reason:
            return ""
        reasons.append(reason)
    return "; ".join(reasons)


@dataclasses.dataclass(frozen=True)
class SubmittedClaim:
    """A job being submitted, as the flavor check weighs it."""

    workspace_id: int
    requested: dict[str, float]
    gpu_flavors: tuple[str, ...]
    pk: int = 0
    max_runtime_seconds: int = 0
