"""Backfill around an overdue head beyond its guarantee: EASY backfilling (Lifka's, as Slurm's
and Maui's backfill schedulers do it), with the jobs' runtime limits as their run times.

Under ``fair_share`` a head that does not fit lets the other workspaces go first. For a head
within its workspace's guarantee that has waited too long, admission holds back what it lacks
outright (:class:`HeldBack`). A head beyond its guarantee holds nothing back: a
workspace whose jobs are larger than its share would otherwise keep every GPU it frees from
going to anyone else. Without it, though, such a head starves: every GPU that frees up goes to
a smaller job, and a workspace of 8-GPU jobs under a small guarantee waits for a moment when 8
are free at once, which a busy organisation never has.

So the first overdue head beyond its guarantee in a pass gets a reservation in time instead:
its *shadow time* is when the deadlines of what the organisation holds (each reservation's
admission plus its job's ``max_runtime_seconds``, past which Manta ends it) free enough of what
it lacks; the *spare* is what is free then beyond its need. A later job that needs any of those
resources may start only if it is sure to end by the shadow time (its own runtime limit), or
if it fits in the spare (which it then uses up). Nothing admitted under the reservation can
push the head past its shadow time, and everything that cannot delay it still runs: capacity
idles only where the head will need it. Runtime limits overstate run times, so the head
usually starts well before its shadow time, as soon as enough has freed up. Under quota
groups (the Fair Tree) a head can be short at a group's limit as well as at the organisation:
what ends frees room at the organisation and at each group above its workspace, the shadow time
is when every place it is short at has room, and the spare is kept per place, so a job under
another group takes nothing of a team's spare.

A shadow time further away than ``MANTA_BACKFILL_WINDOW_HOURS`` (a day, as Slurm's
``bf_window``) makes no reservation: with runtime limits of weeks it would hold capacity back
for weeks (measured on the OpenB trace, where every limit is 150 days: docs/scheduling.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings

from quotas.ledger import EPSILON, Claim, Ledger
from quotas.models import RESOURCES
from quotas.tree import ROOT

from .waiting import Why, held_for

# What the organisation holds, each with its deadline: (deadline, its workspace, resources held).
Deadline = tuple[dt.datetime, int, dict[str, float]]
# Where a head is short: (a quota group, or ROOT for the organisation; a resource).
Place = tuple[int | None, str]


@dataclasses.dataclass
class Shadow:
    """One head's reservation in time: ``at``, when it is sure to fit; ``spare``, at each place
    it is short now, what is free there at ``at`` beyond its need (used up by jobs that run
    past it); ``path`` gives a workspace's quota groups, nearest first."""

    at: dt.datetime
    spare: dict[Place, float]
    path: Callable[[int], tuple[int, ...]] = dataclasses.field(
        default=lambda workspace_id: (), compare=False
    )

    def lets(self, job: Claim, now: dt.datetime) -> bool:
        """Whether ``job``, which fits now, may start without delaying the head; when it may
        only by using the spare, it uses it."""
        needs = [place for place in self.spare if self._takes(job, place)]
        if not needs:
            return True
        if now + dt.timedelta(seconds=job.max_runtime_seconds) <= self.at:
            return True  # it has ended by the shadow time, whatever it runs for
        if all(job.requested[name] <= self.spare[node, name] + EPSILON for node, name in needs):
            for node, name in needs:
                self.spare[node, name] -= job.requested[name]
            return True
        return False

    def _takes(self, job: Claim, place: Place) -> bool:
        """Whether ``job`` would take some of what the head lacks at ``place``."""
        node, name = place
        return bool(job.requested[name]) and (node is ROOT or node in self.path(job.workspace_id))


def shadow_for(
    ledger: Ledger, head: Claim, held: Iterable[Deadline], until: dt.datetime
) -> Shadow | None:
    """The shadow time and spare of ``head``, which does not fit for want of capacity at the
    organisation or at quota groups above it, given what the organisation holds (``held``,
    with their deadlines, in deadline order: read only as far as it needs); what ends frees
    room at the organisation and at each group above its workspace. None when something else
    keeps it out (a max_running_jobs cap, a GPU flavor), or when the deadlines free enough only
    after ``until``, or never."""
    places = [(node, name) for node, name, _ in ledger.shortages(head)]
    if not places or any(name == "running" for _, name in places):
        return None
    free = {place: _free(ledger, place) for place in places}
    if all(free[node, name] + EPSILON >= head.requested[name] for node, name in free):
        return None  # kept out by lending limits, not by what is held
    path = ledger.tree.path
    for deadline, workspace_id, amounts in held:
        if deadline > until:
            return None
        above = path(workspace_id)
        for node, name in free:
            if node is ROOT or node in above:
                free[node, name] += amounts.get(name, 0.0)
        if all(free[node, name] + EPSILON >= head.requested[name] for node, name in free):
            spare = {
                (node, name): room - head.requested[name] for (node, name), room in free.items()
            }
            return Shadow(deadline, spare, path)
    return None


def _free(ledger: Ledger, place: Place) -> float:
    """What is free now at ``place``: its limit (the organisation's capacity) less what is held
    under it."""
    node, name = place
    if node is ROOT:
        return getattr(ledger.org_quota, name) - getattr(ledger.org, name)
    limit = getattr(ledger.tree.groups[node], f"limit_{name}")
    return limit - getattr(ledger.tree.usage[node], name)


class HeldBack:
    """What overdue heads owed their guarantee hold back outright in one ``fair_share`` pass
    (the flat heap of ``jobs/admission.py`` and the Fair Tree alike), each with the job it is
    held for: at each place a head is short at, that resource (or, for ``running``, a place
    under the node's max_running_jobs), else the GPU flavors it accepts when a flavor is all
    that keeps it out, else every resource of the organisation. Held back at a group, a
    resource stays free for the other subtrees."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.places: dict[Place, Any] = {}
        self.flavors: dict[str, Any] = {}

    def hold_for(self, job: Any, places: list[Place]) -> None:
        """Hold back for ``job`` what it lacks at ``places`` (where it is short)."""
        flavors = set() if places else self.ledger.flavors_short_of(job)
        for flavor in flavors:
            self.flavors.setdefault(flavor, job)
        if places or not flavors:
            for place in places or [(ROOT, name) for name in RESOURCES]:
                self.places.setdefault(place, job)

    def keeps(self, job: Any) -> Why | None:
        """Whether ``job`` needs what is held back for another: None when it does not, else
        what says so."""
        if not self.places:
            return None
        path = self.ledger.tree.path(job.workspace_id)
        for (node, name), holder in self.places.items():
            if (node is ROOT or node in path) and (name == "running" or job.requested[name]):
                return (self._held_at, node, name, holder)
        return None

    def keeps_flavor(self, job: Any) -> Why | None:
        """Whether ``job``, which fits, would take a GPU of a flavor held back for another:
        None when it would not, else what says so."""
        if not self.flavors or not self.ledger.takes_flavor(job, set(self.flavors)):
            return None
        flavor = self.ledger.flavors.flavor_of(job)
        return (held_for, f"GPU flavor {flavor}", self.flavors[flavor])

    def _held_at(self, node: int | None, name: str, holder: Any) -> str:
        what = "a place under max_running_jobs" if name == "running" else name
        if node is not ROOT:
            what += f" at quota group '{self.ledger.groups[node].name}'"
        elif self.ledger.groups:
            what += " at the organisation"
        return held_for(what, holder)


class Backfill:
    """One pass's backfill around the first overdue head beyond its guarantee: the pass calls
    :meth:`blocked` for each head that does not fit and asks :meth:`lets` of each job that
    does. ``deadlines`` reads what the organisation holds with their deadlines, once, and only
    when a head needs a shadow."""

    def __init__(
        self,
        ledger: Ledger,
        now: dt.datetime,
        overdue: Callable[[Any], bool],
        deadlines: Callable[[], list[Deadline]],
    ):
        self.ledger, self.now, self.overdue = ledger, now, overdue
        self._deadlines = deadlines
        self._held: list[Deadline] | None = None  # read once, in deadline order
        self.shadow: Shadow | None = None
        self.head: Any = None  # the job the shadow is for

    def blocked(self, head: Any, admitted: list[Any]) -> None:
        """``head`` does not fit: should it be the first overdue one beyond its guarantee that
        waits only for the organisation's capacity, it gets the shadow (``admitted``: what the
        pass admitted before it, held until their own deadlines)."""
        if self.shadow is not None or not settings.MANTA_BACKFILL_WINDOW_HOURS:
            return
        if not self.overdue(head):
            return
        if self.ledger.workspace_blocker(head) or self.ledger.within_guarantee(head):
            return  # its own limits keep it out, or it is owed and held back for outright
        if self._held is None:
            self._held = sorted(self._deadlines(), key=_deadline)
        runs = sorted(
            ((self._ends(job), job.workspace_id, job.requested) for job in admitted), key=_deadline
        )
        until = self.now + dt.timedelta(hours=settings.MANTA_BACKFILL_WINDOW_HOURS)
        held = heapq.merge(self._held, runs, key=_deadline)
        self.shadow = shadow_for(self.ledger, head, held, until)
        if self.shadow is not None:
            self.head = head

    def lets(self, job: Any) -> bool:
        """Whether ``job``, which fits, may start (:meth:`Shadow.lets`)."""
        return self.shadow is None or self.shadow.lets(job, self.now)

    def why(self, job: Any) -> str:
        """Why ``job``, which fits, does not start (:meth:`lets` said no)."""
        spare = ", ".join(
            f"{name} {amount:g}"
            + ("" if node is ROOT else f" in quota group '{self.ledger.groups[node].name}'")
            for (node, name), amount in self.shadow.spare.items()
        )
        return (
            f"job {self.head.pk} has waited more than balanced_max_wait_seconds and is reserved "
            f"room at {self.shadow.at.isoformat(timespec='seconds')}, when the running jobs' "
            f"max_runtime_seconds have freed enough for it; this job's max_runtime_seconds "
            f"({job.max_runtime_seconds}) runs past that, and it needs more than is spare "
            f"then ({spare})"
        )

    def _ends(self, job: Any) -> dt.datetime:
        return self.now + dt.timedelta(seconds=job.max_runtime_seconds)


def _deadline(item: Deadline) -> dt.datetime:
    return item[0]
