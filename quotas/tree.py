"""The quota tree's arithmetic: what each group above the workspaces holds, what its lending
limits keep back, and which group a claim does not fit under.

Pure, like ``quotas/ledger.py``, whose :class:`~quotas.ledger.Ledger` holds one
:class:`QuotaTree` and asks it about the levels between a workspace and the organisation. The
organisation is the root (its capacity is its limit), :class:`~quotas.models.QuotaGroup` rows are
the inner nodes, workspace quotas the leaves. For a node *n* and a resource:

- ``usage(n)``: what the reservations of the workspaces in its subtree hold;
- ``locked(n) = max(0, guaranteed(n) − lending_limit(n))`` (0 without a lending limit): the part
  of its guarantee it does not lend, held for its subtree whether used or not;
- ``eff(leaf) = max(usage, locked)``, ``eff(group) = max(Σ eff(children), locked)``.

A claim fits under a group only while ``usage + need ≤ limit`` and, where the claim makes the
children's ``Σ eff`` grow, that sum stays within the limit too (the organisation likewise, with
its capacity: ``Ledger``'s root check). Without lending limits ``eff`` is ``usage`` and the tree
adds nothing but the groups' own limits. Borrowing needs no rule of its own: a node over its
guarantee takes what its parent has left after its siblings' ``eff``, and so on up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from config.errors import InvalidInput

from .models import RESOURCES, QuotaGroup, WorkspaceQuota

if TYPE_CHECKING:
    from .ledger import Claim, Usage

EPSILON = 1e-9
ROOT = None  # the organisation, as a parent


def locked(quota: QuotaGroup | WorkspaceQuota | None, name: str) -> float:
    """What of its guarantee of ``name`` the node keeps for itself (0: it lends all of it)."""
    if quota is None:
        return 0.0
    lending = getattr(quota, f"lending_limit_{name}")
    if lending is None:
        return 0.0
    return max(0.0, getattr(quota, f"guaranteed_{name}") - lending)


def lends_all(quota: QuotaGroup | WorkspaceQuota | None) -> bool:
    return all(locked(quota, name) <= 0 for name in RESOURCES)


class QuotaTree:
    """The groups of one organisation, what each one's subtree holds (``usage``), and the
    ``Σ eff`` of each node's children (kept only when some node keeps part of its guarantee)."""

    def __init__(
        self,
        groups: dict[int, QuotaGroup],
        ws_quotas: dict[int, WorkspaceQuota],
        ws_usage: dict[int, Usage],
    ):
        from .ledger import Usage

        self.groups = groups
        self.ws_quotas = ws_quotas
        self.usage: dict[int, Usage] = defaultdict(Usage)
        self._paths: dict[int, tuple[int, ...]] = {}
        self._ancestry: dict[int, tuple[int, ...]] = {}
        for ws_id, held in ws_usage.items():
            for group_id in self.path(ws_id):
                target = self.usage[group_id]
                for name in (*RESOURCES, "running"):
                    setattr(target, name, getattr(target, name) + getattr(held, name))
        self.keeps = not all(lends_all(g) for g in groups.values()) or not all(
            lends_all(q) for q in ws_quotas.values()
        )
        # eff bookkeeping: each node's eff as last counted, and Σ eff of each node's children.
        self.child_eff: dict[int | None, dict[str, float]] = defaultdict(
            lambda: dict.fromkeys(RESOURCES, 0.0)
        )
        self._ws_eff: dict[int, dict[str, float]] = {}
        self._group_eff: dict[int, dict[str, float]] = {}
        if self.keeps:
            self._count_eff(ws_usage)

    # --- shape ---------------------------------------------------------------------------

    def ancestry(self, group_id: int | None) -> tuple[int, ...]:
        """``group_id`` and the groups above it, nearest first (a cycle stops the walk)."""
        if group_id is None:
            return ()
        cached = self._ancestry.get(group_id)
        if cached is None:
            chain: list[int] = []
            node: int | None = group_id
            while node is not None and node in self.groups and node not in chain:
                chain.append(node)
                node = self.groups[node].parent_id
            cached = self._ancestry[group_id] = tuple(chain)
        return cached

    def path(self, workspace_id: int) -> tuple[int, ...]:
        """The groups above a workspace, nearest first (empty: directly under the org)."""
        cached = self._paths.get(workspace_id)
        if cached is None:
            quota = self.ws_quotas.get(workspace_id)
            cached = self._paths[workspace_id] = self.ancestry(quota.group_id if quota else None)
        return cached

    def common_depth(self, a: int, b: int) -> int:
        """How many groups two workspaces share: the depth of their lowest common ancestor
        (0: only the organisation)."""
        top_a, top_b = self.path(a)[::-1], self.path(b)[::-1]
        depth = 0
        while depth < min(len(top_a), len(top_b)) and top_a[depth] == top_b[depth]:
            depth += 1
        return depth

    # --- holding -------------------------------------------------------------------------

    def hold(self, workspace_id: int, requested: dict[str, float], sign: int, ws: Usage) -> None:
        """Count a hold of the workspace (whose own usage ``ws`` is already updated) in the
        groups above it."""
        for group_id in self.path(workspace_id):
            self.usage[group_id].add(requested, sign)
        if self.keeps:
            self._refresh(workspace_id, ws)

    def _ws_eff_now(self, workspace_id: int, ws: Usage) -> dict[str, float]:
        quota = self.ws_quotas.get(workspace_id)
        return {name: max(getattr(ws, name), locked(quota, name)) for name in RESOURCES}

    def _group_eff_now(self, group_id: int) -> dict[str, float]:
        group, children = self.groups[group_id], self.child_eff[group_id]
        return {name: max(children[name], locked(group, name)) for name in RESOURCES}

    def _parent(self, group_id: int) -> int | None:
        parent = self.groups[group_id].parent_id
        return parent if parent in self.groups else ROOT

    def _count_eff(self, ws_usage: dict[int, Usage]) -> None:
        from .ledger import Usage

        for ws_id in set(self.ws_quotas) | set(ws_usage):
            eff = self._ws_eff[ws_id] = self._ws_eff_now(ws_id, ws_usage.get(ws_id) or Usage())
            path = self.path(ws_id)
            _add(self.child_eff[path[0] if path else ROOT], eff)
        # deepest first: a group's eff needs its children's
        for group_id in sorted(self.groups, key=lambda g: -len(self.ancestry(g))):
            eff = self._group_eff[group_id] = self._group_eff_now(group_id)
            _add(self.child_eff[self._parent(group_id)], eff)

    def _refresh(self, workspace_id: int, ws: Usage) -> None:
        """Carry the change of one workspace's eff up its path."""
        new = self._ws_eff_now(workspace_id, ws)
        old = self._ws_eff.get(workspace_id) or dict.fromkeys(RESOURCES, 0.0)
        self._ws_eff[workspace_id] = new
        delta = {name: new[name] - old[name] for name in RESOURCES}
        path = self.path(workspace_id)
        for group_id in path:
            _add(self.child_eff[group_id], delta)
            new = self._group_eff_now(group_id)
            old = self._group_eff[group_id]
            self._group_eff[group_id] = new
            delta = {name: new[name] - old[name] for name in RESOURCES}
        _add(self.child_eff[ROOT], delta)

    # --- what a claim needs --------------------------------------------------------------

    def growth(self, claim: Claim, ws: Usage) -> list[dict[str, float]]:
        """How much the claim would add to ``Σ eff`` of the children of each node on its path,
        nearest group first, the organisation last (empty when no node keeps anything)."""
        if not self.keeps:
            return []
        quota = self.ws_quotas.get(claim.workspace_id)
        old = self._ws_eff.get(claim.workspace_id) or dict.fromkeys(RESOURCES, 0.0)
        delta = {
            name: max(getattr(ws, name) + claim.requested[name], locked(quota, name)) - old[name]
            for name in RESOURCES
        }
        grows = []
        for group_id in self.path(claim.workspace_id):
            grows.append(delta)
            group, children, before = (
                self.groups[group_id],
                self.child_eff[group_id],
                self._group_eff[group_id],
            )
            delta = {
                name: max(children[name] + delta[name], locked(group, name)) - before[name]
                for name in RESOURCES
            }
        grows.append(delta)
        return grows

    def shortages(
        self, claim: Claim, grows: list[dict[str, float]]
    ) -> Iterator[tuple[int, str, str]]:
        """The groups above the claim's workspace that it does not fit under, nearest first:
        (group, resource or ``running``, why)."""
        for level, group_id in enumerate(self.path(claim.workspace_id)):
            group, usage = self.groups[group_id], self.usage[group_id]
            for name in RESOURCES:
                need, limit = claim.requested[name], getattr(group, f"limit_{name}")
                if not need or limit is None:
                    continue
                held = getattr(usage, name)
                kept = self.kept(group_id, name, held, grows[level] if grows else None, limit)
                why = over(f"group '{group.name}' {name} limit", limit, held, need, kept)
                if why:
                    yield group_id, name, why
            cap = group.max_running_jobs
            if cap is not None and usage.running >= cap:
                yield (
                    group_id,
                    "running",
                    (f"group '{group.name}' max_running_jobs {cap}: {usage.running} running"),
                )

    def kept(
        self, node: int | None, name: str, held: float, grows: dict | None, limit: float
    ) -> float | None:
        """What the lending limits of ``node``'s children keep back beyond what they hold,
        when the claim makes their ``Σ eff`` grow past ``limit`` (None: it does not)."""
        if grows is None or grows[name] <= EPSILON:
            return None
        total = self.child_eff[node][name]
        if total + grows[name] <= limit + EPSILON:
            return None
        return max(0.0, total - held)

    def borrowing(self, group_id: int, name: str) -> bool:
        return (
            getattr(self.usage[group_id], name)
            > getattr(self.groups[group_id], f"guaranteed_{name}") + EPSILON
        )


def over(label: str, limit: float, held: float, need: float, kept: float | None) -> str:
    """Why ``need`` more does not fit under ``limit`` ('' when it does), ``label`` naming the
    node, resource and kind of limit: what it holds, plus what its children's lending limits
    keep back (``kept``: None when the claim stays within those)."""
    if kept is not None:
        return (
            f"{label} {limit:g}: {held:g} reserved and {kept:g} kept for guarantees that "
            f"are not lent, this job needs {need:g}"
        )
    if held + need > limit + EPSILON:
        return f"{label} {limit:g}: {held:g} reserved, this job needs {need:g}"
    return ""


def _add(target: dict[str, float], amounts: dict[str, float]) -> None:
    for name in RESOURCES:
        target[name] += amounts[name]


# --- a consistent tree (checked by ``quotas/services.py`` on every quota write) ---------------


def check_tree(
    capacity: dict[str, float | None],
    groups: list[QuotaGroup],
    ws_quotas: list[WorkspaceQuota],
) -> None:
    """Refuse a tree that is not one, or whose numbers contradict each other: a group that is
    its own ancestor; per node guaranteed ≤ limit, lending limit ≤ guaranteed, limit ≤ the
    nearest limit above it (the organisation's: its capacity); per node, the guarantees of its
    children add up to at most its own (the organisation's: its capacity), so every guarantee
    is backed all the way up."""
    by_id = {group.pk: group for group in groups}
    for group in groups:
        seen: set[int] = set()
        parent = group.parent_id
        while parent is not None and parent in by_id:
            if parent == group.pk or parent in seen:
                raise InvalidInput.on(
                    "parent", f"group '{group.name}' would be its own ancestor (a cycle)"
                )
            seen.add(parent)
            parent = by_id[parent].parent_id
    nodes: list[tuple[Any, int | None]] = [(g, g.parent_id) for g in groups]
    nodes += [(q, q.group_id) for q in ws_quotas]
    sums: dict[int | None, dict[str, float]] = defaultdict(lambda: dict.fromkeys(RESOURCES, 0.0))
    for node, parent in nodes:
        for name in RESOURCES:
            guaranteed = getattr(node, f"guaranteed_{name}")
            limit = getattr(node, f"limit_{name}")
            lending = getattr(node, f"lending_limit_{name}")
            if limit is not None and guaranteed > limit:
                raise InvalidInput.on(
                    f"guaranteed_{name}", f"guaranteed {guaranteed:g} is above the limit {limit:g}"
                )
            if lending is not None and lending > guaranteed + EPSILON:
                raise InvalidInput.on(
                    f"lending_limit_{name}",
                    f"lending limit {lending:g} is above the guarantee {guaranteed:g}: a node "
                    "lends at most what it is guaranteed",
                )
            ceiling, what = _ceiling(capacity, by_id, parent, name)
            if limit is not None and ceiling is not None and limit > ceiling + EPSILON:
                raise InvalidInput.on(
                    f"limit_{name}", f"limit {limit:g} is above {what} {ceiling:g}"
                )
            sums[parent][name] += guaranteed
    for parent, totals in sums.items():
        for name, total in totals.items():
            if parent is None:
                bound, what = capacity[name], "the capacity"
                field = f"guaranteed_{name}" if nodes else name
                under = "the workspaces' guarantees"
            else:
                group = by_id[parent]
                bound, what = getattr(group, f"guaranteed_{name}"), "its guarantee"
                field, under = f"guaranteed_{name}", f"the guarantees under group '{group.name}'"
            if bound is not None and total > bound + EPSILON:
                raise InvalidInput.on(field, f"{under} add up to {total:g}, above {what} {bound:g}")


def _ceiling(
    capacity: dict[str, float | None],
    by_id: dict[int, QuotaGroup],
    parent: int | None,
    name: str,
) -> tuple[float | None, str]:
    """The nearest limit of ``name`` above a node whose parent is ``parent``."""
    seen: set[int] = set()
    while parent is not None and parent in by_id and parent not in seen:
        seen.add(parent)
        group = by_id[parent]
        limit = getattr(group, f"limit_{name}")
        if limit is not None:
            return limit, f"group '{group.name}''s limit"
        parent = group.parent_id
    return capacity[name], "the organisation's capacity"
