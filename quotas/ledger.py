"""The admission arithmetic: what is held, against which limits, and what would fit.

Pure: nothing here reads or writes the database. ``quotas.selectors.ledger_for`` fills a
:class:`Ledger` from the reservations and quotas; admission (``jobs/admission.py``) asks it what
blocks a claim, counts what it admits, and plans preemptions with :func:`victims_for`. A claim is
anything with a workspace, the resources it asks for and how long it may run: a queued job, or an
active reservation (:class:`Held`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterator
from typing import Any, Protocol

from .flavors import FlavorBook, untracked_blocker
from .models import RESOURCES, OrgQuota, QuotaGroup, WorkspaceQuota
from .tree import ROOT, QuotaTree, over

EPSILON = 1e-9  # resources are floats: 0.1 + 0.2 must still fit under 0.3


class Claim(Protocol):
    """What admission weighs of a job."""

    pk: int
    workspace_id: int

    @property
    def requested(self) -> dict[str, float]: ...

    @property
    def max_runtime_seconds(self) -> int: ...


@dataclasses.dataclass
class Usage:
    cpu: float = 0.0
    memory_gb: float = 0.0
    gpu: float = 0.0
    disk_gb: float = 0.0
    running: int = 0

    def add(self, requested: dict[str, float], sign: int = 1) -> None:
        for name in RESOURCES:
            setattr(self, name, getattr(self, name) + sign * requested[name])
        self.running += sign


@dataclasses.dataclass(frozen=True)
class Held:
    """One active reservation: what a launching/running job holds (a preemption candidate)."""

    job_id: int
    workspace_id: int
    priority: int
    admitted_at: Any
    requested: dict[str, float]
    max_runtime_seconds: int = 0
    # Its minimum runtime (already capped by the organisation), and since when its attempt runs
    # (None while it launches).
    min_runtime_seconds: int = 0
    running_since: dt.datetime | None = None
    # Already preempted, within its grace period: its capacity is on its way back.
    leaving: bool = False
    gpu_flavor: str = ""  # the GPU flavor its reservation holds (quotas/flavors.py)

    def protected(self, now: dt.datetime) -> bool:
        """Whether the job is within its minimum runtime, so no victim: it asked for one and
        has not run that long yet (a job still launching has not started to)."""
        if self.min_runtime_seconds <= 0:
            return False
        if self.running_since is None:
            return True
        return (now - self.running_since).total_seconds() < self.min_runtime_seconds


@dataclasses.dataclass(frozen=True)
class PastUsage:
    """A workspace's decayed past usage (``quotas.models.FairShareUsage``): per resource, the
    amount × seconds held, as it stood at ``as_of``."""

    amounts: dict[str, float]
    as_of: dt.datetime

    def at(self, now: dt.datetime, half_life_seconds: float) -> dict[str, float]:
        """The amounts decayed to ``now``: each halves every ``half_life_seconds``."""
        factor = decay(max(0.0, (now - self.as_of).total_seconds()), half_life_seconds)
        return {name: self.amounts.get(name, 0.0) * factor for name in RESOURCES}


def decay(seconds: float, half_life_seconds: float) -> float:
    """What 1 becomes after ``seconds``: 2^(-seconds / half-life)."""
    return 2.0 ** (-seconds / half_life_seconds)


def accrued(amount: float, seconds: float, half_life_seconds: float) -> float:
    """The decayed usage, at its end, of holding ``amount`` for ``seconds``: each moment of the
    hold decays from when it was used, ∫₀ˢ amount · 2^(-t/h) dt = amount · h/ln 2 · (1 - 2^(-s/h)).
    A short hold counts ≈ amount × seconds; one far longer than the half-life saturates."""
    if seconds <= 0 or amount <= 0:
        return 0.0
    return amount * half_life_seconds / math.log(2) * (1.0 - decay(seconds, half_life_seconds))


def month_start(now: dt.datetime) -> dt.datetime:
    """The start of the GPU budget period ``now`` is in."""
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def budget_overrun(
    quota: WorkspaceQuota | None, used: float, requested_gpu: float, max_runtime_seconds: float
) -> str:
    """Why a GPU job would exceed its workspace's monthly budget ('' when it would not), given
    the GPU-hours ``used`` this period. A job may use up to requested GPUs × its max runtime."""
    if not quota or quota.gpu_hours_per_month is None or not requested_gpu:
        return ""
    worst = requested_gpu * max_runtime_seconds / 3600
    if used + worst <= quota.gpu_hours_per_month + EPSILON:
        return ""
    return (
        f"GPU budget {quota.gpu_hours_per_month:g} h/month: {used:g} h used, this job may "
        f"use up to {worst:g} h"
    )


@dataclasses.dataclass
class Ledger:
    """What is held now, and the limits to hold it against: the workspaces' own, those of the
    quota groups above them (``tree``, :class:`~quotas.tree.QuotaTree`), the organisation's
    capacity and the shared host's.

    A claim fits only if, at every node of its path (workspace → groups → organisation),
    usage + need ≤ limit (the organisation's limit is its capacity), and max_running_jobs
    likewise; where lending limits keep part of some guarantees back, each group and the
    organisation admit only while the ``Σ eff`` of their children stays within their limit
    (``quotas/tree.py``). Without groups and lending limits this is exactly the two-level rule:
    the workspace's limit, then the organisation's capacity."""

    org_quota: OrgQuota | None
    ws_quotas: dict[int, WorkspaceQuota]
    org: Usage
    ws: dict[int, Usage]
    gpu_hours_used: dict[int, float] = dataclasses.field(default_factory=dict)
    # The shared local host: what every organisation holds on it, what it has, and which of
    # this organisation's workspaces launch there.
    host: Usage = dataclasses.field(default_factory=Usage)
    host_capacity: dict[str, float | None] = dataclasses.field(default_factory=dict)
    on_host: set[int] = dataclasses.field(default_factory=set)
    # Fair share: each workspace's decayed past usage, and the half-life it decays with.
    past: dict[int, PastUsage] = dataclasses.field(default_factory=dict)
    half_life_seconds: float = 86_400.0
    # GPU flavors: what of each type of GPU is allowed and held (None: flavors not counted).
    flavors: FlavorBook | None = None
    # The quota groups between the organisation and its workspaces (none: a flat organisation).
    groups: dict[int, QuotaGroup] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tree = QuotaTree(self.groups, self.ws_quotas, self.ws)
        if self.flavors is not None:
            self.flavors.attach(self.groups, self.tree)
        self._group_caps = {
            name
            for name in RESOURCES
            if any(getattr(g, f"limit_{name}") is not None for g in self.groups.values())
        }
        self._past_sums: tuple[dt.datetime, dict[int, dict[str, float]]] | None = None

    def blocker(self, claim: Claim) -> str:
        """Why ``claim`` does not fit now ('' when it does)."""
        return (
            self.workspace_blocker(claim)
            or self.org_blocker(claim)
            or self.host_blocker(claim)
            or self.flavor_blocker(claim)
        )

    def flavor_blocker(self, claim: Claim) -> str:
        """Why no GPU flavor the claim accepts fits ('' when one does): at its workspace, the
        groups above it, the organisation or its pool (``quotas/flavors.py``). Where no flavor
        is counted, only a claim that names one is blocked: nothing offers it."""
        if self.flavors is None:
            return untracked_blocker(claim)
        return self.flavors.blocker(claim)

    def reclaimable_blocker(self, claim: Claim) -> str:
        """What others hold that preemption could take back for ``claim`` ('' when nothing):
        the totals at the groups and the organisation, or a flavor the claim is owed."""
        reason = self.org_blocker(claim)
        if reason or self.flavors is None:
            return reason
        return self.flavor_blocker(claim) if self.flavors.reclaimable(claim) else ""

    def host_blocker(self, claim: Claim) -> str:
        """What of the local host's capacity (shared by every organisation) stops it."""
        if claim.workspace_id not in self.on_host:
            return ""
        for name in RESOURCES:
            capacity, need = self.host_capacity.get(name), claim.requested[name]
            held = getattr(self.host, name)
            if need and capacity is not None and held + need > capacity + EPSILON:
                return (
                    f"this host's {name} capacity {capacity:g}: {held:g} "
                    f"reserved by all organisations, this job needs {need:g}"
                )
        return ""

    def workspace_blocker(self, claim: Claim) -> str:
        """What of the claim's own workspace stops it (limits, budget, max running): what no
        preemption of other workspaces can change."""
        ws_usage = self.ws[claim.workspace_id]
        quota = self.ws_quotas.get(claim.workspace_id)
        for name in RESOURCES:
            need = claim.requested[name]
            limit = quota.limit()[name] if quota else None
            if need and limit is not None and getattr(ws_usage, name) + need > limit + EPSILON:
                return (
                    f"workspace {name} limit {limit:g}: {getattr(ws_usage, name):g} reserved, "
                    f"this job needs {need:g}"
                )
        if claim.workspace_id in self.gpu_hours_used:
            over = budget_overrun(
                quota,
                self.gpu_hours_used[claim.workspace_id],
                claim.requested["gpu"],
                claim.max_runtime_seconds,
            )
            if over:
                return over + "; it waits for the next budget period"
        if (
            quota
            and quota.max_running_jobs is not None
            and ws_usage.running >= quota.max_running_jobs
        ):
            return (
                f"workspace max_running_jobs {quota.max_running_jobs}: {ws_usage.running} running"
            )
        return ""

    def org_blocker(self, claim: Claim) -> str:
        """What others hold: the limits of the groups above the claim's workspace (nearest
        first), then the organisation's capacity."""
        for _, _, why in self.shortages(claim):
            return why
        return ""

    def shortages(self, claim: Claim) -> Iterator[tuple[int | None, str, str]]:
        """Each node above the claim's workspace it does not fit under, nearest first: (group,
        or None for the organisation; the resource, or ``running`` for a max_running_jobs cap;
        why)."""
        grows = self.tree.growth(claim, self.ws[claim.workspace_id])
        yield from self.tree.shortages(claim, grows)
        if self.org_quota is None:
            return
        for name in RESOURCES:
            need, capacity = claim.requested[name], getattr(self.org_quota, name)
            if not need or capacity is None:
                continue
            held = getattr(self.org, name)
            kept = self.tree.kept(ROOT, name, held, grows[-1] if grows else None, capacity)
            why = over(f"organisation {name} capacity", capacity, held, need, kept)
            if why:
                yield ROOT, name, why
        org_max = self.org_quota.max_running_jobs
        if org_max is not None and self.org.running >= org_max:
            yield (
                ROOT,
                "running",
                (f"organisation max_running_jobs {org_max}: {self.org.running} running"),
            )

    def flavors_short_of(self, claim: Claim) -> set[str]:
        """The GPU flavors ``claim`` accepts when a flavor is what keeps it out (none when it
        is not, or when flavors are not counted): what holding back for it means."""
        if self.flavors is None or not claim.requested["gpu"] or not self.flavor_blocker(claim):
            return set()
        return set(self.flavors.candidates(claim))

    def takes_flavor(self, claim: Claim, flavors: set[str]) -> bool:
        """Whether ``claim``, which fits, would take a GPU of one of ``flavors``."""
        return (
            bool(flavors)
            and self.flavors is not None
            and bool(claim.requested["gpu"])
            and self.flavors.flavor_of(claim) in flavors
        )

    def short_of(self, claim: Claim) -> list[str]:
        """The resources the organisation has too little of left for ``claim``."""
        return [
            name for node, name, _ in self.shortages(claim) if node is ROOT and name != "running"
        ]

    def hold(self, claim: Claim | Held, sign: int = 1) -> None:
        """Count what ``claim`` holds (``sign=-1``: stop counting it)."""
        self.org.add(claim.requested, sign)
        ws = self.ws[claim.workspace_id]
        ws.add(claim.requested, sign)
        self.tree.hold(claim.workspace_id, claim.requested, sign, ws)
        if claim.workspace_id in self.on_host:
            self.host.add(claim.requested, sign)
        if self.flavors is not None:
            self.flavors.hold(claim, sign)

    def guarantee(self, workspace_id: int) -> dict[str, float]:
        quota = self.ws_quotas.get(workspace_id)
        return quota.guaranteed() if quota else dict.fromkeys(RESOURCES, 0.0)

    def under_guarantee(self, workspace_id: int) -> bool:
        """Whether the workspace holds less than its guarantee of some resource or flavor."""
        guaranteed, usage = self.guarantee(workspace_id), self.ws[workspace_id]
        return any(getattr(usage, name) < guaranteed[name] for name in RESOURCES) or (
            self.flavors is not None and self.flavors.under_guarantee(workspace_id)
        )

    def capped(self, name: str) -> bool:
        """Whether the organisation or a group of its tree caps ``name``: only such a resource
        can be short, so only it is borrowed, shared and given back."""
        return (
            self.org_quota is not None and getattr(self.org_quota, name) is not None
        ) or name in self._group_caps

    def within_guarantee(self, claim: Claim) -> bool:
        """Whether the claim, added to what its workspace holds, stays within its guarantee of
        every capped resource (an uncapped resource is never short). The groups above it are
        then within theirs too: the tree's guarantees add up (``quotas.tree.check_tree``: the
        children of a node are guaranteed at most what it is), so what borrowers hold beyond
        their own guarantees is all that stands between the claim and its guarantee."""
        guaranteed, usage = self.guarantee(claim.workspace_id), self.ws[claim.workspace_id]
        return all(
            getattr(usage, name) + claim.requested[name] <= guaranteed[name] + EPSILON
            for name in RESOURCES
            if self.capped(name)
        ) and (self.flavors is None or self.flavors.within_guarantee(claim))

    def borrowing(self, workspace_id: int, name: str) -> bool:
        """Whether the workspace holds more of ``name`` than it is guaranteed (only a capped
        resource can be borrowed)."""
        if not self.capped(name):
            return False
        return getattr(self.ws[workspace_id], name) > self.guarantee(workspace_id)[name] + EPSILON

    def borrows_from(self, claimant_id: int, workspace_id: int, name: str) -> bool:
        """Whether ``workspace_id`` takes ``name`` from ``claimant_id``'s side of the tree:
        it and every group above it below their lowest common ancestor hold more than their
        guarantee (a node within its guarantee is never a victim, at any level)."""
        if not self.borrowing(workspace_id, name):
            return False
        path = self.tree.path(workspace_id)
        below = len(path) - self.tree.common_depth(claimant_id, workspace_id)
        return all(self.tree.borrowing(group_id, name) for group_id in path[:below])

    def anyone_borrowing(self) -> bool:
        return any(self.borrowing(ws, name) for ws in list(self.ws) for name in RESOURCES) or (
            self.flavors is not None and self.flavors.anyone_borrowing()
        )

    def borrows_flavor_from(self, claimant_id: int, workspace_id: int, flavor: str) -> bool:
        """:meth:`borrows_from` for one GPU flavor: the workspace and every group above it
        below the lowest common ancestor with the claimant hold more than their guarantee of
        it."""
        below = len(self.tree.path(workspace_id)) - self.tree.common_depth(
            claimant_id, workspace_id
        )
        return self.flavors is not None and self.flavors.borrows_from(workspace_id, flavor, below)

    def dominant_share(self, workspace_id: int) -> float:
        """What the workspace holds now as a share of its guarantee, of the capped resource
        where that share is largest."""
        usage = self.ws[workspace_id]
        return self._share_of_guarantee(
            self.guarantee(workspace_id), {name: getattr(usage, name) for name in RESOURCES}
        )

    def usage_share(self, workspace_id: int, now: dt.datetime) -> float:
        """The workspace's past usage as a share of its guarantee: per resource, the decayed
        amount-seconds × ln 2 / half-life — the average amount it held, each past moment
        weighted by its decay (a workspace that held g all along has g) — over its guarantee,
        of the resource where that is largest. 0 without history."""
        past = self.past.get(workspace_id)
        if past is None:
            return 0.0
        return self._past_share(self.guarantee(workspace_id), past.at(now, self.half_life_seconds))

    def _past_share(self, guaranteed: dict[str, float], amounts: dict[str, float]) -> float:
        per_second = math.log(2) / self.half_life_seconds
        held = {name: amount * per_second for name, amount in amounts.items()}
        return self._share_of_guarantee(guaranteed, held)

    def accrue(
        self, workspace_id: int, requested: dict[str, float], seconds: float, at: dt.datetime
    ) -> None:
        """Add a hold of ``requested`` for ``seconds`` that ended at ``at`` to the workspace's
        past usage, as ``quotas.services.fair_share_usage_fold`` does when a reservation is
        released: what a prediction's replay does at each simulated end."""
        half_life = self.half_life_seconds
        past = self.past.get(workspace_id)
        amounts = past.at(at, half_life) if past else dict.fromkeys(RESOURCES, 0.0)
        for name in RESOURCES:
            amounts[name] += accrued(requested.get(name, 0.0), seconds, half_life)
        self.past[workspace_id] = PastUsage(amounts, at)
        self._past_sums = None  # the groups' sums at ``at`` are stale

    def weight(self, workspace_id: int) -> float:
        quota = self.ws_quotas.get(workspace_id)
        return quota.fair_share_weight if quota and quota.fair_share_weight > 0 else 1.0

    def fair_share_key(self, workspace_id: int, now: dt.datetime) -> float:
        """The fair_share order, lowest first: (share now + past usage share) ÷ weight."""
        share = self.dominant_share(workspace_id) + self.usage_share(workspace_id, now)
        return share / self.weight(workspace_id)

    def group_share(self, group_id: int, now: dt.datetime) -> tuple[float, float]:
        """A group's (share now, past usage share) of its guarantee: what its subtree holds
        now, and its workspaces' decayed past usage summed."""
        group, usage = self.groups[group_id], self.tree.usage[group_id]
        guaranteed = group.guaranteed()
        current = self._share_of_guarantee(
            guaranteed, {name: getattr(usage, name) for name in RESOURCES}
        )
        past = self._group_past(now).get(group_id)
        return current, self._past_share(guaranteed, past) if past else 0.0

    def group_key(self, group_id: int, now: dt.datetime) -> float:
        """A group's fair-share key among its siblings: (share now + past share) ÷ weight."""
        weight = self.groups[group_id].fair_share_weight
        return sum(self.group_share(group_id, now)) / (weight if weight > 0 else 1.0)

    def fair_share_path_key(self, workspace_id: int, now: dt.datetime) -> tuple[float, ...]:
        """The hierarchical fair_share order (Slurm's Fair Tree), lowest first: the key of each
        node on the workspace's path from the top, so siblings are compared at the highest
        level where their paths part (a flat organisation: the workspace's key alone)."""
        path = self.tree.path(workspace_id)
        return (
            *(self.group_key(group_id, now) for group_id in reversed(path)),
            self.fair_share_key(workspace_id, now),
        )

    def _group_past(self, now: dt.datetime) -> dict[int, dict[str, float]]:
        """Each group's decayed past usage at ``now`` (its workspaces' summed), computed once
        per ``now``: a pass asks with one clock."""
        if self._past_sums is None or self._past_sums[0] != now:
            sums: dict[int, dict[str, float]] = {}
            for ws_id, past in self.past.items():
                path = self.tree.path(ws_id)
                if not path:
                    continue
                amounts = past.at(now, self.half_life_seconds)
                for group_id in path:
                    total = sums.setdefault(group_id, dict.fromkeys(RESOURCES, 0.0))
                    for name in RESOURCES:
                        total[name] += amounts[name]
            self._past_sums = (now, sums)
        return self._past_sums[1]

    def _share_of_guarantee(self, guaranteed: dict[str, float], held: dict[str, float]) -> float:
        """max over the capped resources of held ÷ guaranteed (∞ where it holds one it has no
        guarantee of). An uncapped resource is never short, so it is nobody's share: a
        workspace's CPUs must not make it last when only GPUs are contended."""
        shares = []
        for name in RESOURCES:
            if not self.capped(name):
                continue
            used = held[name]
            if guaranteed[name] > 0:
                shares.append(used / guaranteed[name])
            elif used > EPSILON:
                shares.append(float("inf"))
        return max(shares, default=0.0)


def victims_for(ledger: Ledger, claim: Claim, candidates: list[Held]) -> list[Held] | None:
    """Borrowed reservations whose release makes room for ``claim`` (``ledger`` is updated), or
    None when even all of them would not (then nothing is released).

    Nearest borrowers first: candidates whose workspace shares the deepest common ancestor with
    the claim's (siblings before cousins), each level in the order given. A candidate is useful
    only when it frees a resource the claim is short of (or, when only a running-jobs cap stops
    it, any resource) at a node above both of them, and its workspace and every group above it
    below that common ancestor borrow that resource (``Ledger.borrows_from``): a node within
    its guarantee is never a victim, so two workspaces cannot preempt each other."""
    tree, ws_id = ledger.tree, claim.workspace_id
    if ledger.groups:
        depth = {held.workspace_id: 0 for held in candidates}
        for other in depth:
            depth[other] = tree.common_depth(ws_id, other)
        candidates = sorted(candidates, key=lambda held: -depth[held.workspace_id])
    chosen: list[Held] = []
    for held in candidates:
        if held.workspace_id == ws_id:
            continue
        shared = set(tree.path(ws_id)) & set(tree.path(held.workspace_id))
        owed = ledger.flavors.reclaimable(claim) if ledger.flavors is not None else None
        if owed is not None and any(node is ROOT or node in shared for node in owed[1]):
            # Short of a GPU flavor above both: only a borrower of that flavor gives it back.
            flavor = owed[0]
            useful = (
                held.gpu_flavor == flavor
                and held.requested["gpu"] > 0
                and ledger.borrows_flavor_from(ws_id, held.workspace_id, flavor)
            )
        else:
            short = {
                name for node, name, _ in ledger.shortages(claim) if node is ROOT or node in shared
            }
            names = RESOURCES if "running" in short else short
            useful = any(
                held.requested[name] > 0 and ledger.borrows_from(ws_id, held.workspace_id, name)
                for name in names
            )
        if not useful:
            continue
        ledger.hold(held, -1)
        chosen.append(held)
        if not ledger.blocker(claim):
            return chosen
    for held in chosen:
        ledger.hold(held)
    return None
