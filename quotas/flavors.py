"""GPU flavors in admission: which type of GPU a job gets, and what of each type is held.

Pure, like ``quotas/ledger.py``, of which it is a layer: the ledger asks a :class:`FlavorBook`
(``Ledger.flavors``) whether a claim's GPUs fit, after its own checks of the totals, and tells
it what is held. A flavor is a type of GPU (``h100``); ``UNTYPED`` ("") is the flavor-less
``gpu`` of targets that declare none.

Each workspace launches on one :class:`Pool` of GPUs: the local host's typed inventory (shared
by every organisation), or a compute target's declared flavors. A claim names the flavors it
accepts, in order of preference (none: any flavor of its pool, in the pool's order); admission
takes the first that fits (Kueue's flavor fungibility) and records it on the reservation. A
flavor fits when it stays within, for that flavor: the workspace's limit, the organisation's
capacity less what it guarantees to other workspaces and they do not use, and the pool's
capacity. Guarantees per flavor are held back rather than lent: flavors are not preempted
(yet), so a guarantee lent out would not come back.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from config.gpu_flavors import UNTYPED, flavor_problem

EPSILON = 1e-9


def label(flavor: str) -> str:
    """A flavor as a message names it."""
    return f"GPU flavor {flavor}" if flavor else "untyped GPUs"


@dataclasses.dataclass(frozen=True)
class Pool:
    """The GPUs of one place jobs launch: per flavor, in the order it offers them, how many it
    has (None: as many as asked, e.g. a target that declares no flavors)."""

    key: str  # "host:local", "target:<org id>:<name>"; what counts the pool's held GPUs
    where: str  # for messages: "this host", "compute target gpu-cluster"
    flavors: dict[str, float | None]


UNTYPED_POOL = Pool("", "the compute target", {UNTYPED: None})


def acceptable(claim: Any) -> tuple[str, ...]:
    """The flavors a claim accepts, in order (empty: any)."""
    return tuple(getattr(claim, "gpu_flavors", ()) or ())


def untracked_blocker(claim: Any) -> str:
    """Why ``claim`` cannot fit where no pool or quota names a flavor ('' unless it names
    one: then nothing offers it)."""
    if not claim.requested["gpu"] or not acceptable(claim):
        return ""
    return FlavorBook({}, {}, {}).blocker(claim)


@dataclasses.dataclass
class FlavorBook:
    """What each flavor allows and holds, for one organisation's admission pass."""

    # OrgQuota.gpu_flavors: flavor -> GPUs (a flavor not named has no cap of its own).
    org_capacity: dict[str, float]
    # WorkspaceQuota.gpu_flavors: workspace -> flavor -> {"guaranteed": g, "limit": l | None}.
    ws_quotas: dict[int, dict[str, dict[str, Any]]]
    pools: dict[int, Pool]  # workspace -> its pool (absent: UNTYPED_POOL)
    org_held: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    ws_held: dict[int, dict[str, float]] = dataclasses.field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    # pool key -> flavor -> held; the host's counts every organisation's reservations there.
    pool_held: dict[str, dict[str, float]] = dataclasses.field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    chosen: dict[int, str] = dataclasses.field(default_factory=dict)  # claim pk -> flavor

    def pool(self, workspace_id: int) -> Pool:
        return self.pools.get(workspace_id, UNTYPED_POOL)

    def candidates(self, claim: Any) -> tuple[str, ...]:
        return acceptable(claim) or tuple(self.pool(claim.workspace_id).flavors)

    def blocker(self, claim: Any) -> str:
        """Why none of the flavors ``claim`` accepts fits now ('' when one does: it is
        remembered as the claim's, for :meth:`hold`)."""
        if not claim.requested["gpu"]:
            self.chosen[claim.pk] = UNTYPED
            return ""
        reasons = []
        for flavor in self.candidates(claim):
            reason = self.never_fits(claim, flavor) or self.full(claim, flavor)
            if not reason:
                self.chosen[claim.pk] = flavor
                return ""
            reasons.append(reason)
        return "; ".join(reasons)

    def flavor_of(self, claim: Any) -> str:
        """The flavor ``claim`` holds or would hold: the one :meth:`blocker` chose, else the
        first it accepts that fits, else its first."""
        if not claim.requested["gpu"]:
            return UNTYPED
        if claim.pk not in self.chosen and self.blocker(claim):
            return self.candidates(claim)[0] if self.candidates(claim) else UNTYPED
        return self.chosen[claim.pk]

    def never_fits(self, claim: Any, flavor: str) -> str:
        """Why ``claim`` could never run on ``flavor``, whatever is released ('' when it
        could): its pool has none, or it needs more than a limit or capacity of the flavor."""
        need = claim.requested["gpu"]
        pool = self.pool(claim.workspace_id)
        if flavor not in pool.flavors:
            return f"{pool.where} has no {label(flavor)}, so it can never fit there"
        ceilings = (
            (pool.flavors[flavor], f"{pool.where}'s {label(flavor)} capacity"),
            (self._limit(claim.workspace_id, flavor), f"the workspace's {label(flavor)} limit"),
            (self.org_capacity.get(flavor), f"the organisation's {label(flavor)} capacity"),
        )
        for ceiling, what in ceilings:
            if ceiling is not None and need > ceiling + EPSILON:
                return f"{what} is {ceiling:g}, this job needs {need:g}, so it can never fit"
        return ""

    def full(self, claim: Any, flavor: str) -> str:
        """What of ``flavor`` is held now that leaves no room for ``claim`` ('' if none)."""
        need, ws_id = claim.requested["gpu"], claim.workspace_id
        held = self.ws_held[ws_id][flavor]
        limit = self._limit(ws_id, flavor)
        if limit is not None and held + need > limit + EPSILON:
            return (
                f"workspace {label(flavor)} limit {limit:g}: {held:g} reserved, "
                f"this job needs {need:g}"
            )
        capacity = self.org_capacity.get(flavor)
        if capacity is not None:
            kept = self.kept_for_others(ws_id, flavor)
            org_held = self.org_held[flavor]
            if org_held + kept + need > capacity + EPSILON:
                others = f", {kept:g} guaranteed to other workspaces" if kept > EPSILON else ""
                return (
                    f"organisation {label(flavor)} capacity {capacity:g}: {org_held:g} "
                    f"reserved{others}, this job needs {need:g}"
                )
        pool = self.pool(ws_id)
        capacity = pool.flavors.get(flavor)
        pool_held = self.pool_held[pool.key][flavor]
        if capacity is not None and pool_held + need > capacity + EPSILON:
            return (
                f"{pool.where}'s {label(flavor)} capacity {capacity:g}: {pool_held:g} "
                f"reserved, this job needs {need:g}"
            )
        return ""

    def kept_for_others(self, workspace_id: int, flavor: str) -> float:
        """What other workspaces are guaranteed of ``flavor`` and do not hold now."""
        return sum(
            max(0.0, (quotas.get(flavor) or {}).get("guaranteed", 0) - self.ws_held[ws][flavor])
            for ws, quotas in self.ws_quotas.items()
            if ws != workspace_id
        )

    def hold(self, claim: Any, sign: int = 1) -> None:
        """Count (``sign=-1``: stop counting) the GPUs ``claim`` holds of its flavor: a held
        reservation's recorded one (``gpu_flavor``), else the one chosen for it."""
        gpus = claim.requested["gpu"]
        if not gpus:
            return
        flavor = getattr(claim, "gpu_flavor", None)
        if flavor is None:
            flavor = self.flavor_of(claim)
        self.org_held[flavor] += sign * gpus
        self.ws_held[claim.workspace_id][flavor] += sign * gpus
        self.pool_held[self.pool(claim.workspace_id).key][flavor] += sign * gpus

    def _limit(self, workspace_id: int, flavor: str) -> float | None:
        return ((self.ws_quotas.get(workspace_id) or {}).get(flavor) or {}).get("limit")


# --- the quota rows' JSON, checked strictly ---------------------------------------------------


def org_capacity_problems(value: Any) -> dict[str, list[str]]:
    """What is wrong with an ``OrgQuota.gpu_flavors`` (``{"h100": 8}``), by field."""
    if not isinstance(value, dict):
        return {"gpu_flavors": ['must be an object of GPU counts per flavor, e.g. {"h100": 8}']}
    errors: dict[str, list[str]] = {}
    for name, count in value.items():
        problem = flavor_problem(name) or _count_problem(count)
        if problem:
            errors[f"gpu_flavors.{name}"] = [problem]
    return errors


def workspace_quota_problems(value: Any) -> dict[str, list[str]]:
    """What is wrong with a ``WorkspaceQuota.gpu_flavors``
    (``{"h100": {"guaranteed": 2, "limit": 4}}``), by field."""
    example = 'e.g. {"h100": {"guaranteed": 2, "limit": 4}}'
    if not isinstance(value, dict):
        return {"gpu_flavors": [f"must be an object of quotas per flavor, {example}"]}
    errors: dict[str, list[str]] = {}
    for name, quota in value.items():
        field = f"gpu_flavors.{name}"
        if flavor_problem(name):
            errors[field] = [flavor_problem(name)]
        elif not isinstance(quota, dict) or not quota:
            errors[field] = [f"must be an object with guaranteed and/or limit, {example}"]
        elif set(quota) - {"guaranteed", "limit"}:
            unknown = ", ".join(sorted(set(quota) - {"guaranteed", "limit"}))
            errors[field] = [f"unknown key(s) {unknown}: only guaranteed and limit"]
        else:
            for key in ("guaranteed", "limit"):
                value_of = quota.get(key)
                problem = _count_problem(value_of) if key in quota else ""
                if key == "limit" and value_of is None:
                    problem = ""
                if problem:
                    errors[f"{field}.{key}"] = [problem]
            guaranteed, limit = quota.get("guaranteed", 0), quota.get("limit")
            valid = f"{field}.guaranteed" not in errors and f"{field}.limit" not in errors
            if valid and limit is not None and guaranteed > limit:
                errors[f"{field}.guaranteed"] = [
                    f"guaranteed {guaranteed:g} is above the limit {limit:g}"
                ]
    return errors


def normalised_workspace_quota(value: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each flavor's quota with both keys: guaranteed 0 and limit None (no limit of its own)
    where not given."""
    return {
        name: {"guaranteed": float(q.get("guaranteed", 0)), "limit": q.get("limit")}
        for name, q in value.items()
    }


def consistency_problems(
    org_capacity: dict[str, float], ws_quotas: list[dict[str, dict[str, Any]]]
) -> dict[str, list[str]]:
    """Per flavor, as for the totals: limit ≤ capacity, Σ guaranteed ≤ capacity."""
    errors: dict[str, list[str]] = {}
    names = {name for quota in ws_quotas for name in quota}
    for name in sorted(names):
        capacity = org_capacity.get(name)
        total = sum(quota.get(name, {}).get("guaranteed", 0) for quota in ws_quotas)
        if capacity is None:
            continue
        for quota in ws_quotas:
            limit = quota.get(name, {}).get("limit")
            if limit is not None and limit > capacity:
                errors[f"gpu_flavors.{name}.limit"] = [
                    f"limit {limit:g} is above the organisation's {name} capacity {capacity:g}"
                ]
        if total > capacity + EPSILON:
            errors[f"gpu_flavors.{name}.guaranteed"] = [
                f"the workspaces' {name} guarantees add up to {total:g}, above the "
                f"capacity {capacity:g}"
            ]
    return errors


def _count_problem(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number of GPUs, not {value!r}"
    if not 0 <= value <= 1_000_000:
        return f"must be between 0 and 1,000,000, not {value:g}"
    return ""
