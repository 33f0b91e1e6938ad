"""``fair_share`` under a quota tree: Slurm's Fair Tree, one admission at a time.

From the organisation down, the pass takes the child (a quota group, or a workspace directly
under the node) with the lowest fair-share key among those that still have a queued job this pass
could admit, until it reaches a workspace; that workspace's next job (in base order) is admitted
if it fits, and the workspace waits for the rest of the pass if it does not. So siblings are
compared at the highest level where their paths part: a division's share decides before any of
its teams', a team's before any of its workspaces'. The keys are ``quotas/ledger.py``'s
(``Ledger.group_key``, ``Ledger.fair_share_key``); a flat organisation keeps the single heap
of ``jobs/admission.py``.

Why not that heap with the path's keys: an admission raises the keys of its groups, so every
workspace under them would go stale at once; here an admission costs one key per active child of
each node on the way down (17 for 2 divisions × 5 teams × 10 workspaces), whatever the queue,
and recomputes only the keys of the admitted workspace and of the groups above it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from quotas.ledger import Ledger

from .backfill import Backfill, HeldBack
from .waiting import NOBODY, Watch, in_this_pass

ROOT = None


def plan_fair_tree(
    ledger: Ledger,
    queue: Any,
    now: dt.datetime,
    *,
    overdue: Callable[[Any], bool],
    backfill: Backfill | None = None,
    watch: Watch = NOBODY,
) -> list[Any]:
    """The jobs to admit now, in admission order (``ledger`` is updated as they are held);
    ``queue`` as ``jobs.admission.plan`` takes it.

    A head that does not fit and is ``overdue`` (it waited past the organisation's
    ``balanced_max_wait_seconds`` for capacity its workspace is owed) holds back, at each node
    it is short at, what it is short of: no later job under that node that needs it starts
    before it (``jobs/admission.py``'s flat ``fair_share`` does the same at the organisation).
    Held back at a group, a resource stays free for the other subtrees. Another head that does
    not fit is handed to ``backfill`` (``jobs/backfill.py``), which may give it a reservation in
    time that later jobs must not delay. ``watch``: as ``jobs.admission.plan`` takes it."""
    tree = ledger.tree
    heads: dict[int, Any] = {}
    queues: dict[int, Iterator[Any]] = {}
    for ws in queue.workspace_ids():
        queues[ws] = queue.jobs(ws)
        head = next(queues[ws], None)
        if head is not None:
            heads[ws] = head
    # Each node's children: ("group", id) and ("ws", id); and how many of a group's workspaces
    # still have a head this pass.
    children: dict[int | None, list[tuple[str, int]]] = defaultdict(list)
    active: dict[int, int] = defaultdict(int)
    for group_id in ledger.groups:
        parent = tree.ancestry(group_id)[1:2]
        children[parent[0] if parent else ROOT].append(("group", group_id))
    for ws in heads:
        path = tree.path(ws)
        children[path[0] if path else ROOT].append(("ws", ws))
        for group_id in path:
            active[group_id] += 1

    def live(child: tuple[str, int]) -> bool:
        kind, pk = child
        return pk in heads if kind == "ws" else active[pk] > 0

    # A key changes only when its node's holdings or its head do: after an admission, those of
    # the admitted workspace and of the groups above it; so keys are kept until then.
    keys: dict[tuple[str, int], tuple] = {}

    def key(child: tuple[str, int]) -> tuple:
        found = keys.get(child)
        if found is None:
            kind, pk = child
            if kind == "group":
                found = (ledger.group_key(pk, now), 1, ledger.groups[pk].name)
            else:
                job = heads[pk]
                found = (ledger.fair_share_key(pk, now), 0, -job.priority, job.queued_at, job.pk)
            keys[child] = found
        return found

    def changed(ws: int) -> None:
        keys.pop(("ws", ws), None)
        for group_id in tree.path(ws):
            keys.pop(("group", group_id), None)

    def drop(ws: int) -> None:
        del heads[ws]
        for group_id in tree.path(ws):
            active[group_id] -= 1

    held_back = HeldBack(ledger)  # what overdue heads owed their guarantee hold back
    admitted: list[Any] = []
    while heads:
        node: int | None = ROOT
        while True:
            kind, pk = min((c for c in children[node] if live(c)), key=key)
            if kind == "ws":
                break
            node = pk
        job = heads[pk]
        category = "held_back"
        if why := held_back.keeps(job):
            pass  # it needs what a job ahead of it has waited too long for
        elif blocker := ledger.blocker(job):
            if overdue(job):
                held_back.hold_for(job, [(at, name) for at, name, _ in ledger.shortages(job)])
            elif backfill is not None:
                backfill.blocked(job, admitted)
            category, why = "admission_pass", (in_this_pass, blocker, admitted)
        elif why := held_back.keeps_flavor(job):
            pass  # it would take a GPU of the flavor an overdue job waits for
        elif backfill is not None and not backfill.lets(job):
            why = (backfill.why, job)  # it would delay an overdue head past its shadow time
        else:
            ledger.hold(job)
            admitted.append(job)
            watch.admitted(job)
            changed(pk)
            following = next(queues[pk], None)
            if following is None:
                drop(pk)
            else:
                heads[pk] = following
            continue
        # It does not start: its workspace waits for the rest of the pass.
        watch.passed(job, category, *why)
        watch.workspace_waits(job, *why)
        drop(pk)
    return admitted
