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
from typing import Any, Protocol

from .flavors import FlavorBook, untracked_blocker
from .models import RESOURCES, OrgQuota, WorkspaceQuota

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
    """What is held now, and the limits to hold it against."""

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

    def blocker(self, claim: Claim) -> str:
        """Why ``claim`` does not fit now ('' when it does)."""
        return (
            self.workspace_blocker(claim)
            or self.org_blocker(claim)
            or self.host_blocker(claim)
            or self.flavor_blocker(claim)
        )

    def flavor_blocker(self, claim: Claim) -> str:
        """Why no GPU flavor the claim accepts fits ('' when one does): what no preemption
        changes yet, as flavors are not preempted. Where no flavor is counted, only a claim
        that names one is blocked: nothing offers it."""
        if self.flavors is None:
            return untracked_blocker(claim)
        return self.flavors.blocker(claim)

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
        """What of the organisation's capacity stops it: what others hold."""
        for name in self.short_of(claim):
            capacity = getattr(self.org_quota, name)
            return (
                f"organisation {name} capacity {capacity:g}: {getattr(self.org, name):g} "
                f"reserved, this job needs {claim.requested[name]:g}"
            )
        org_max = self.org_quota.max_running_jobs if self.org_quota else None
        if org_max is not None and self.org.running >= org_max:
            return f"organisation max_running_jobs {org_max}: {self.org.running} running"
        return ""

    def short_of(self, claim: Claim) -> list[str]:
        """The resources the organisation has too little of left for ``claim``."""
        if self.org_quota is None:
            return []
        return [
            name
            for name in RESOURCES
            if claim.requested[name]
            and getattr(self.org_quota, name) is not None
            and getattr(self.org, name) + claim.requested[name]
            > getattr(self.org_quota, name) + EPSILON
        ]

    def hold(self, claim: Claim | Held, sign: int = 1) -> None:
        """Count what ``claim`` holds (``sign=-1``: stop counting it)."""
        self.org.add(claim.requested, sign)
        self.ws[claim.workspace_id].add(claim.requested, sign)
        if claim.workspace_id in self.on_host:
            self.host.add(claim.requested, sign)
        if self.flavors is not None:
            self.flavors.hold(claim, sign)

    def guarantee(self, workspace_id: int) -> dict[str, float]:
        quota = self.ws_quotas.get(workspace_id)
        return quota.guaranteed() if quota else dict.fromkeys(RESOURCES, 0.0)

    def under_guarantee(self, workspace_id: int) -> bool:
        """Whether the workspace holds less than its guarantee of some resource."""
        guaranteed, usage = self.guarantee(workspace_id), self.ws[workspace_id]
        return any(getattr(usage, name) < guaranteed[name] for name in RESOURCES)

    def within_guarantee(self, claim: Claim) -> bool:
        """Whether the claim, added to what its workspace holds, stays within its guarantee of
        every resource the organisation caps (an uncapped resource is never short)."""
        guaranteed, usage = self.guarantee(claim.workspace_id), self.ws[claim.workspace_id]
        return all(
            getattr(usage, name) + claim.requested[name] <= guaranteed[name] + EPSILON
            for name in RESOURCES
            if self.org_quota is not None and getattr(self.org_quota, name) is not None
        )

    def borrowing(self, workspace_id: int, name: str) -> bool:
        """Whether the workspace holds more of ``name`` than it is guaranteed (only a resource
        the organisation caps can be borrowed)."""
        if self.org_quota is None or getattr(self.org_quota, name) is None:
            return False
        return getattr(self.ws[workspace_id], name) > self.guarantee(workspace_id)[name] + EPSILON

    def anyone_borrowing(self) -> bool:
        return any(self.borrowing(ws, name) for ws in list(self.ws) for name in RESOURCES)

    def dominant_share(self, workspace_id: int) -> float:
        """What the workspace holds now as a share of its guarantee, of the capped resource
        where that share is largest."""
        usage = self.ws[workspace_id]
        return self._share_of_guarantee(
            workspace_id, {name: getattr(usage, name) for name in RESOURCES}
        )

    def usage_share(self, workspace_id: int, now: dt.datetime) -> float:
        """The workspace's past usage as a share of its guarantee: per resource, the decayed
        amount-seconds × ln 2 / half-life — the average amount it held, each past moment
        weighted by its decay (a workspace that held g all along has g) — over its guarantee,
        of the resource where that is largest. 0 without history."""
        past = self.past.get(workspace_id)
        if past is None:
            return 0.0
        per_second = math.log(2) / self.half_life_seconds
        held = {
            name: amount * per_second
            for name, amount in past.at(now, self.half_life_seconds).items()
        }
        return self._share_of_guarantee(workspace_id, held)

    def weight(self, workspace_id: int) -> float:
        quota = self.ws_quotas.get(workspace_id)
        return quota.fair_share_weight if quota and quota.fair_share_weight > 0 else 1.0

    def fair_share_key(self, workspace_id: int, now: dt.datetime) -> float:
        """The fair_share order, lowest first: (share now + past usage share) ÷ weight."""
        share = self.dominant_share(workspace_id) + self.usage_share(workspace_id, now)
        return share / self.weight(workspace_id)

    def _share_of_guarantee(self, workspace_id: int, held: dict[str, float]) -> float:
        """max over the resources the organisation caps of held ÷ guaranteed (∞ where it holds
        one it has no guarantee of). An uncapped resource is never short, so it is nobody's
        share: a workspace's CPUs must not make it last when only GPUs are contended."""
        quota = self.ws_quotas.get(workspace_id)
        shares = []
        for name in RESOURCES:
            if self.org_quota is None or getattr(self.org_quota, name) is None:
                continue
            guaranteed = quota.guaranteed()[name] if quota else 0
            used = held[name]
            if guaranteed > 0:
                shares.append(used / guaranteed)
            elif used > EPSILON:
                shares.append(float("inf"))
        return max(shares, default=0.0)


def victims_for(ledger: Ledger, claim: Claim, candidates: list[Held]) -> list[Held] | None:
    """Borrowed reservations whose release makes room for ``claim`` (``ledger`` is updated), or
    None when even all of them would not (then nothing is released).

    A candidate is useful only when its workspace borrows a resource the claim is short of (or,
    when only the running-jobs cap stops it, any resource): a workspace within its guarantee is
    never a victim, so two workspaces cannot preempt each other."""
    chosen: list[Held] = []
    for held in candidates:
        if held.workspace_id == claim.workspace_id:
            continue
        short = ledger.short_of(claim)
        running_full = not short and ledger.org_blocker(claim) != ""
        useful = any(
            held.requested[name] > 0 and ledger.borrowing(held.workspace_id, name)
            for name in (short or (RESOURCES if running_full else ()))
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
