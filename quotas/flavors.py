"""GPU flavors in admission: which type of GPU a job gets, and what of each type is held.

Pure, like ``quotas/ledger.py``, of which it is a layer: the ledger asks a :class:`FlavorBook`
(``Ledger.flavors``) whether a claim's GPUs fit, after its own checks of the totals, and tells
it what is held. A flavor is a type of GPU (``h100``); ``UNTYPED`` ("") is the flavor-less
``gpu`` of targets that declare none.

Each workspace launches on one :class:`Pool` of GPUs: the local host's typed inventory (shared
by every organisation), or a compute target's declared flavors. A claim names the flavors it
accepts, in order of preference (none: any flavor of its pool, in the pool's order); admission
takes the first that fits (Kueue's flavor fungibility) and records it on the reservation. A
flavor fits when it stays within, for that flavor: the workspace's limit and budget, the limit
of every quota group above it and the organisation's capacity (with the quota tree's lending
arithmetic, per flavor: :class:`FlavorBook`), and the pool's capacity. Preemption asks it which
flavor a claim is owed and who borrows it (``quotas.ledger.victims_for``).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterator
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


def flavor_budgets(quotas: dict[str, Any] | None) -> dict[str, float]:
    """The monthly GPU-hour budget of each flavor a workspace's ``gpu_flavors`` sets one for."""
    return {
        flavor: q["gpu_hours_per_month"]
        for flavor, q in (quotas or {}).items()
        if (q or {}).get("gpu_hours_per_month") is not None
    }


def _quota(quotas: dict[str, Any] | None, flavor: str) -> dict[str, Any]:
    """One flavor's quota in a node's ``gpu_flavors`` ({} when it has none of its own)."""
    return (quotas or {}).get(flavor) or {}


class StaticPaths:
    """The groups above each workspace, nearest first, when there is no
    :class:`~quotas.tree.QuotaTree` (a submission's check)."""

    def __init__(self, paths: dict[int, tuple[int, ...]]):
        self.paths = paths

    def path(self, workspace_id: int) -> tuple[int, ...]:
        return self.paths.get(workspace_id, ())

    def ancestry(self, group_id: int | None) -> tuple[int, ...]:
        for path in self.paths.values():
            if group_id in path:
                return path[path.index(group_id) :]
        return ()


NO_TREE = StaticPaths({})
ROOT = None  # the organisation, as a node


@dataclasses.dataclass
class FlavorBook:
    """What each flavor allows and holds, for one organisation's admission pass: at every node
    of its quota tree (workspace → groups → organisation) and in each pool.

    Per flavor the tree works as ``quotas/tree.py`` does for the totals: a node's ``locked``
    part of its guarantee is kept for its subtree; ``eff(ws) = max(held, locked)``,
    ``eff(group) = max(Σ eff(children), locked)``; a claim fits under a node with a limit of the
    flavor only while ``held + need ≤ limit`` and, where it makes ``Σ eff`` of the node's
    children grow, that sum stays within the limit too. A workspace keeps all of its flavor
    guarantee unless its ``lending_limit`` lends some (as before flavors could be lent); a
    group lends all of it unless its ``lending_limit`` keeps some (as for the totals)."""

    # OrgQuota.gpu_flavors: flavor -> GPUs (a flavor not named has no cap of its own).
    org_capacity: dict[str, float]
    # WorkspaceQuota.gpu_flavors: workspace -> flavor -> {"guaranteed": g, "limit": l | None,
    # optionally "lending_limit" and "gpu_hours_per_month"}.
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
    # GPU-hours used this period, by flavor, of each workspace with a per-flavor budget.
    hours_used: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    # The quota groups (id -> a QuotaGroup: name, gpu_flavors) and the tree's shape (``path``,
    # ``ancestry``): ``Ledger`` attaches its own (:meth:`attach`).
    groups: dict[int, Any] = dataclasses.field(default_factory=dict)
    tree: Any = NO_TREE
    # Per node and flavor: what the groups hold, and the eff bookkeeping (built on first use,
    # from what is held then).
    _group_held: dict[int, dict[str, float]] | None = dataclasses.field(
        default=None, init=False, repr=False
    )
    _ws_eff: dict[int, dict[str, float]] = dataclasses.field(init=False, repr=False)
    _group_eff: dict[int, dict[str, float]] = dataclasses.field(init=False, repr=False)
    _child_eff: dict[int | None, dict[str, float]] = dataclasses.field(init=False, repr=False)

    def attach(self, groups: dict[int, Any], tree: Any) -> None:
        """Count the flavors at the quota groups of ``tree`` too."""
        self.groups, self.tree, self._group_held = groups, tree, None

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
            *(
                (_quota(self.groups[g].gpu_flavors, flavor).get("limit"),
                 f"quota group '{self.groups[g].name}''s {label(flavor)} limit")
                for g in self.tree.path(claim.workspace_id) if g in self.groups
            ),
            (self.org_capacity.get(flavor), f"the organisation's {label(flavor)} capacity"),
        )  # fmt: skip
        for ceiling, what in ceilings:
            if ceiling is not None and need > ceiling + EPSILON:
                return f"{what} is {ceiling:g}, this job needs {need:g}, so it can never fit"
        return ""

    def full(self, claim: Any, flavor: str) -> str:
        """What of ``flavor`` is held now that leaves no room for ``claim`` ('' if none): the
        workspace's limit or budget, a node above it, or the pool."""
        reason = self.workspace_full(claim, flavor)
        if reason:
            return reason
        for _, why in self.shortages(claim, flavor):
            return why
        pool = self.pool(claim.workspace_id)
        need, capacity = claim.requested["gpu"], pool.flavors.get(flavor)
        pool_held = self.pool_held[pool.key][flavor]
        if capacity is not None and pool_held + need > capacity + EPSILON:
            return (
                f"{pool.where}'s {label(flavor)} capacity {capacity:g}: {pool_held:g} "
                f"reserved, this job needs {need:g}"
            )
        return ""

    def workspace_full(self, claim: Any, flavor: str) -> str:
        """What of the claim's own workspace stops it on ``flavor`` (its limit, its budget):
        what no preemption of others changes."""
        need, ws_id = claim.requested["gpu"], claim.workspace_id
        held = self.ws_held[ws_id][flavor]
        limit = self._limit(ws_id, flavor)
        if limit is not None and held + need > limit + EPSILON:
            return (
                f"workspace {label(flavor)} limit {limit:g}: {held:g} reserved, "
                f"this job needs {need:g}"
            )
        over = self.over_budget(claim, flavor)
        return f"{over}; it waits for the next budget period" if over else ""

    def over_budget(self, claim: Any, flavor: str) -> str:
        """Why ``claim`` would exceed its workspace's monthly GPU-hour budget of ``flavor``
        ('' when it would not): it may use up to its GPUs × its max runtime."""
        budget = _quota(self.ws_quotas.get(claim.workspace_id), flavor).get("gpu_hours_per_month")
        if budget is None:
            return ""
        used = (self.hours_used.get(claim.workspace_id) or {}).get(flavor, 0.0)
        worst = claim.requested["gpu"] * claim.max_runtime_seconds / 3600
        if used + worst <= budget + EPSILON:
            return ""
        return (
            f"{label(flavor)} budget {budget:g} h/month: {used:g} h used, this job may use up "
            f"to {worst:g} h"
        )

    def shortages(self, claim: Any, flavor: str) -> Iterator[tuple[int | None, str]]:
        """The nodes above the claim's workspace (groups nearest first, then the organisation,
        ``ROOT``) that have no room for it on ``flavor``: (node, why)."""
        self._count()
        need, ws_id = claim.requested["gpu"], claim.workspace_id
        path = self.tree.path(ws_id)
        grows = self._growth(ws_id, flavor, need, path)
        nodes = [
            (g, _quota(self.groups[g].gpu_flavors, flavor).get("limit"),
             f"group '{self.groups[g].name}' {label(flavor)} limit", self._group_held[g][flavor])
            for g in path
        ]  # fmt: skip
        nodes.append(
            (ROOT, self.org_capacity.get(flavor), f"organisation {label(flavor)} capacity",
             self.org_held[flavor])
        )  # fmt: skip
        for (node, limit, what, held), grow in zip(nodes, grows, strict=True):
            if limit is None:
                continue
            total = self._child_eff[node][flavor] + grow
            kept = max(0.0, total - held - need)
            if grow > EPSILON and total > limit + EPSILON and kept > EPSILON:
                yield (
                    node,
                    (
                        f"{what} {limit:g}: {held:g} reserved and {kept:g} kept for guarantees "
                        f"that are not lent, this job needs {need:g}"
                    ),
                )
            elif held + need > limit + EPSILON:
                yield node, f"{what} {limit:g}: {held:g} reserved, this job needs {need:g}"

    def hold(self, claim: Any, sign: int = 1) -> None:
        """Count (``sign=-1``: stop counting) the GPUs ``claim`` holds of its flavor: a held
        reservation's recorded one (``gpu_flavor``), else the one chosen for it."""
        gpus = claim.requested["gpu"]
        if not gpus:
            return
        flavor = getattr(claim, "gpu_flavor", None)
        if flavor is None:
            flavor = self.flavor_of(claim)
        ws_id = claim.workspace_id
        self.org_held[flavor] += sign * gpus
        self.ws_held[ws_id][flavor] += sign * gpus
        self.pool_held[self.pool(ws_id).key][flavor] += sign * gpus
        if self._group_held is not None:  # else counted from ws_held when first needed
            for group_id in self.tree.path(ws_id):
                self._group_held[group_id][flavor] += sign * gpus
            self._refresh(ws_id, flavor)

    # --- the tree per flavor ---------------------------------------------------------------

    def ws_locked(self, workspace_id: int, flavor: str) -> float:
        """What of its guarantee of ``flavor`` a workspace keeps (all of it without a lending
        limit: a workspace's flavor guarantee was never lent before it could be)."""
        quota = _quota(self.ws_quotas.get(workspace_id), flavor)
        lending = quota.get("lending_limit")
        guaranteed = quota.get("guaranteed", 0.0)
        return guaranteed if lending is None else max(0.0, guaranteed - lending)

    def group_locked(self, group_id: int, flavor: str) -> float:
        """What of its guarantee of ``flavor`` a group keeps for its subtree (0 without a
        lending limit: it lends all, as for the totals)."""
        quota = _quota(self.groups[group_id].gpu_flavors, flavor)
        lending = quota.get("lending_limit")
        return 0.0 if lending is None else max(0.0, quota.get("guaranteed", 0.0) - lending)

    def _parent(self, group_id: int) -> int | None:
        above = self.tree.ancestry(group_id)[1:2]
        return above[0] if above else ROOT

    def _count(self) -> None:
        """Build what the groups hold and the eff sums per flavor, once, from ``ws_held``."""
        if self._group_held is not None:
            return
        self._group_held = defaultdict(lambda: defaultdict(float))
        self._ws_eff, self._group_eff = {}, {}
        self._child_eff = defaultdict(lambda: defaultdict(float))
        for ws_id in set(self.ws_held) | set(self.ws_quotas):
            path = self.tree.path(ws_id)
            held = self.ws_held[ws_id]
            for group_id in path:
                for flavor, gpus in held.items():
                    self._group_held[group_id][flavor] += gpus
            names = set(held) | set(self.ws_quotas.get(ws_id) or ())
            eff = self._ws_eff[ws_id] = {f: max(held[f], self.ws_locked(ws_id, f)) for f in names}
            _add(self._child_eff[path[0] if path else ROOT], eff)
        for group_id in sorted(self.groups, key=lambda g: -len(self.tree.ancestry(g))):
            names = set(self._child_eff[group_id]) | set(self.groups[group_id].gpu_flavors or ())
            eff = self._group_eff[group_id] = {
                f: max(self._child_eff[group_id][f], self.group_locked(group_id, f)) for f in names
            }
            _add(self._child_eff[self._parent(group_id)], eff)

    def _refresh(self, workspace_id: int, flavor: str) -> None:
        """Carry the change of one workspace's eff of ``flavor`` up its path."""
        effs = self._ws_eff.setdefault(workspace_id, {})
        new = max(self.ws_held[workspace_id][flavor], self.ws_locked(workspace_id, flavor))
        delta, effs[flavor] = new - effs.get(flavor, 0.0), new
        for group_id in self.tree.path(workspace_id):
            self._child_eff[group_id][flavor] += delta
            effs = self._group_eff.setdefault(group_id, {})
            new = max(self._child_eff[group_id][flavor], self.group_locked(group_id, flavor))
            delta, effs[flavor] = new - effs.get(flavor, 0.0), new
        self._child_eff[ROOT][flavor] += delta

    def _growth(self, ws_id: int, flavor: str, need: float, path: tuple[int, ...]) -> list[float]:
        """How much a claim of ``need`` would add to ``Σ eff`` of the children of each node on
        its path, nearest group first, the organisation last."""
        before = (self._ws_eff.get(ws_id) or {}).get(flavor, 0.0)
        delta = max(self.ws_held[ws_id][flavor] + need, self.ws_locked(ws_id, flavor)) - before
        grows = []
        for group_id in path:
            grows.append(delta)
            children = self._child_eff[group_id][flavor]
            before = (self._group_eff.get(group_id) or {}).get(flavor, 0.0)
            delta = max(children + delta, self.group_locked(group_id, flavor)) - before
        grows.append(delta)
        return grows

    # --- preemption per flavor --------------------------------------------------------------

    def capped(self, flavor: str) -> bool:
        """Whether the organisation or a group caps ``flavor``: only then can it be short."""
        return flavor in self.org_capacity or any(
            _quota(g.gpu_flavors, flavor).get("limit") is not None for g in self.groups.values()
        )

    def ws_guaranteed(self, workspace_id: int, flavor: str) -> float:
        return _quota(self.ws_quotas.get(workspace_id), flavor).get("guaranteed", 0.0)

    def within_guarantee(self, claim: Any) -> bool:
        """Whether some flavor the claim accepts is uncapped, or within its workspace's
        guarantee of it once the claim is added."""
        if not claim.requested["gpu"]:
            return True
        held = self.ws_held[claim.workspace_id]
        return any(
            not self.capped(f)
            or held[f] + claim.requested["gpu"]
            <= self.ws_guaranteed(claim.workspace_id, f) + EPSILON
            for f in self.candidates(claim)
            if not self.never_fits(claim, f)
        )

    def reclaimable(self, claim: Any) -> tuple[str, set[int | None]] | None:
        """The flavor preemption may reclaim for ``claim`` and the nodes it is short of it at:
        the first flavor it accepts that is within its workspace's guarantee and blocked only
        at the groups or the organisation (None when one fits already, or none is owed)."""
        if not claim.requested["gpu"] or not self.blocker(claim):
            return None
        need, ws_id = claim.requested["gpu"], claim.workspace_id
        for flavor in self.candidates(claim):
            if self.never_fits(claim, flavor) or self.workspace_full(claim, flavor):
                continue
            if self.ws_held[ws_id][flavor] + need > self.ws_guaranteed(ws_id, flavor) + EPSILON:
                continue
            nodes = {node for node, _ in self.shortages(claim, flavor)}
            if nodes:
                return flavor, nodes
        return None

    def borrowing(self, workspace_id: int, flavor: str) -> bool:
        """Whether the workspace holds more of ``flavor`` than it is guaranteed."""
        return self.capped(flavor) and (
            self.ws_held[workspace_id][flavor] > self.ws_guaranteed(workspace_id, flavor) + EPSILON
        )

    def group_borrowing(self, group_id: int, flavor: str) -> bool:
        self._count()
        guaranteed = _quota(self.groups[group_id].gpu_flavors, flavor).get("guaranteed", 0.0)
        return self._group_held[group_id][flavor] > guaranteed + EPSILON

    def borrows_from(self, workspace_id: int, flavor: str, below: int) -> bool:
        """Whether the workspace, and its ``below`` nearest groups, borrow ``flavor``."""
        path = self.tree.path(workspace_id)
        return self.borrowing(workspace_id, flavor) and all(
            self.group_borrowing(group_id, flavor) for group_id in path[:below]
        )

    def anyone_borrowing(self) -> bool:
        return any(
            self.borrowing(ws_id, flavor)
            for ws_id, held in list(self.ws_held.items())
            for flavor in list(held)
        )

    def under_guarantee(self, workspace_id: int) -> bool:
        """Whether the workspace holds less than its guarantee of some capped flavor."""
        return any(
            self.ws_held[workspace_id][flavor] < quota.get("guaranteed", 0.0) - EPSILON
            for flavor, quota in (self.ws_quotas.get(workspace_id) or {}).items()
            if self.capped(flavor)
        )

    def _limit(self, workspace_id: int, flavor: str) -> float | None:
        return _quota(self.ws_quotas.get(workspace_id), flavor).get("limit")


def _add(target: dict[str, float], amounts: dict[str, float]) -> None:
    for flavor, amount in amounts.items():
        target[flavor] += amount


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


WORKSPACE_KEYS = ("guaranteed", "limit", "lending_limit", "gpu_hours_per_month")
GROUP_KEYS = ("guaranteed", "limit", "lending_limit")
NULLABLE = ("limit", "lending_limit", "gpu_hours_per_month")  # null: none of its own


def workspace_quota_problems(value: Any) -> dict[str, list[str]]:
    """What is wrong with a ``WorkspaceQuota.gpu_flavors``
    (``{"h100": {"guaranteed": 2, "limit": 4, "gpu_hours_per_month": 100}}``), by field."""
    return _quota_problems(value, WORKSPACE_KEYS, 'e.g. {"h100": {"guaranteed": 2, "limit": 4}}')


def group_quota_problems(value: Any) -> dict[str, list[str]]:
    """What is wrong with a ``QuotaGroup.gpu_flavors``
    (``{"h100": {"guaranteed": 4, "limit": 8, "lending_limit": 2}}``), by field."""
    return _quota_problems(
        value, GROUP_KEYS, 'e.g. {"h100": {"guaranteed": 4, "limit": 8, "lending_limit": 2}}'
    )


def _quota_problems(value: Any, keys: tuple[str, ...], example: str) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        return {"gpu_flavors": [f"must be an object of quotas per flavor, {example}"]}
    errors: dict[str, list[str]] = {}
    for name, quota in value.items():
        field = f"gpu_flavors.{name}"
        if flavor_problem(name):
            errors[field] = [flavor_problem(name)]
        elif not isinstance(quota, dict) or not quota:
            errors[field] = [f"must be an object with {' and/or '.join(keys)}, {example}"]
        elif set(quota) - set(keys):
            unknown = ", ".join(sorted(set(quota) - set(keys)))
            errors[field] = [f"unknown key(s) {unknown}: only {', '.join(keys)}"]
        else:
            for key in keys:
                value_of = quota.get(key)
                problem = _count_problem(value_of) if key in quota else ""
                if key in NULLABLE and value_of is None:
                    problem = ""
                if problem:
                    errors[f"{field}.{key}"] = [problem]
            if not any(key.startswith(f"{field}.") for key in errors):
                errors.update(_order_problems(field, quota))
    return errors


def _order_problems(field: str, quota: dict[str, Any]) -> dict[str, list[str]]:
    """guaranteed ≤ limit, lending limit ≤ guaranteed (a node lends at most its guarantee)."""
    guaranteed, limit = quota.get("guaranteed", 0), quota.get("limit")
    lending = quota.get("lending_limit")
    if limit is not None and guaranteed > limit:
        return {f"{field}.guaranteed": [f"guaranteed {guaranteed:g} is above the limit {limit:g}"]}
    if lending is not None and lending > guaranteed + EPSILON:
        return {
            f"{field}.lending_limit": [
                f"lending limit {lending:g} is above the guarantee {guaranteed:g}: a node "
                "lends at most what it is guaranteed"
            ]
        }
    return {}


def normalised_workspace_quota(value: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each flavor's quota with guaranteed (0) and limit (None: no limit of its own) always,
    and a lending limit and budget where given."""
    return {
        name: {
            "guaranteed": float(q.get("guaranteed", 0)),
            "limit": q.get("limit"),
            **{key: q[key] for key in ("lending_limit", "gpu_hours_per_month") if key in q},
        }
        for name, q in value.items()
    }


def normalised_group_quota(value: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each flavor's quota with all three keys: guaranteed 0, limit and lending limit None (no
    limit of its own; it lends all of its guarantee) where not given."""
    return {
        name: {
            "guaranteed": float(q.get("guaranteed", 0)),
            "limit": q.get("limit"),
            "lending_limit": q.get("lending_limit"),
        }
        for name, q in value.items()
    }


def consistency_problems(
    org_capacity: dict[str, float], ws_quotas: list[Any], groups: list[Any] = ()
) -> dict[str, list[str]]:
    """Per flavor, what ``quotas.tree.check_tree`` asks of the totals: a node's limit ≤ the
    nearest limit of the flavor above it (the organisation's: its capacity); the guarantees of
    a node's children add up to at most its own (the organisation's: its capacity). And a
    group's flavors stay within its totals: Σ of their guarantees ≤ its ``guaranteed_gpu``,
    each limit ≤ its ``limit_gpu``. ``ws_quotas`` and ``groups`` are quota rows (their
    ``gpu_flavors``, ``group_id`` / ``parent_id``)."""
    errors: dict[str, list[str]] = {}
    by_id = {group.pk: group for group in groups}
    for group in groups:
        errors.update(_within_totals(group))
    nodes = [(g, g.parent_id, f"group '{g.name}'") for g in groups]
    nodes += [(q, q.group_id, "the workspace") for q in ws_quotas]
    sums: dict[tuple[int | None, str], float] = defaultdict(float)
    for node, parent, who in nodes:
        parent = parent if parent in by_id else None
        for name, quota in (node.gpu_flavors or {}).items():
            limit = quota.get("limit")
            ceiling, what = _flavor_ceiling(org_capacity, by_id, parent, name)
            if limit is not None and ceiling is not None and limit > ceiling + EPSILON:
                errors.setdefault(f"gpu_flavors.{name}.limit", [
                    f"{who}'s {name} limit {limit:g} is above {what} {ceiling:g}"
                ])  # fmt: skip
            sums[parent, name] += quota.get("guaranteed", 0)
    for (parent, name), total in sorted(sums.items(), key=lambda item: (str(item[0]), item[1])):
        if parent is None:
            bound = org_capacity.get(name)
            under, what = f"the {name} guarantees under the organisation", "its capacity"
        else:
            group = by_id[parent]
            bound = _quota(group.gpu_flavors, name).get("guaranteed", 0.0)
            under, what = f"the {name} guarantees under group '{group.name}'", "its guarantee"
        if bound is not None and total > bound + EPSILON:
            errors.setdefault(f"gpu_flavors.{name}.guaranteed", [
                f"{under} add up to {total:g}, above {what} {bound:g}"
            ])  # fmt: skip
    return errors


def _within_totals(group: Any) -> dict[str, list[str]]:
    """A group's flavors within its totals: what it guarantees of all flavors together at most
    its ``guaranteed_gpu``, each flavor's limit at most its ``limit_gpu``."""
    flavors = group.gpu_flavors or {}
    total = sum(quota.get("guaranteed", 0) for quota in flavors.values())
    if total > group.guaranteed_gpu + EPSILON:
        name = next(n for n, q in sorted(flavors.items()) if q.get("guaranteed", 0))
        return {
            f"gpu_flavors.{name}.guaranteed": [
                f"group '{group.name}''s flavor guarantees add up to {total:g}, above its "
                f"guaranteed_gpu {group.guaranteed_gpu:g}"
            ]
        }
    for name, quota in sorted(flavors.items()):
        limit = quota.get("limit")
        if limit is not None and group.limit_gpu is not None and limit > group.limit_gpu:
            return {
                f"gpu_flavors.{name}.limit": [
                    f"group '{group.name}''s {name} limit {limit:g} is above its limit_gpu "
                    f"{group.limit_gpu:g}"
                ]
            }
    return {}


def _flavor_ceiling(
    org_capacity: dict[str, float], by_id: dict[int, Any], parent: int | None, name: str
) -> tuple[float | None, str]:
    """The nearest limit of flavor ``name`` above a node whose parent is ``parent``."""
    seen: set[int] = set()
    while parent is not None and parent in by_id and parent not in seen:
        seen.add(parent)
        group = by_id[parent]
        limit = _quota(group.gpu_flavors, name).get("limit")
        if limit is not None:
            return limit, f"group '{group.name}''s {name} limit"
        parent = group.parent_id
    return org_capacity.get(name), f"the organisation's {name} capacity"


def _count_problem(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number of GPUs, not {value!r}"
    if not 0 <= value <= 1_000_000:
        return f"must be between 0 and 1,000,000, not {value:g}"
    return ""
