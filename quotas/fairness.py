"""Fair allocations: what each workspace would hold were the organisation's capacity split
fairly among the workspaces that want some of it.

A workspace's fair allocation of a resource is its weighted max-min (water-filling) share of
the capacity given its demand (what it holds plus what it has queued), weighted by its
guarantee: a workspace that wants less than its weight's share gets what it wants, and the rest
is split again among the others. Its normalised share is held ÷ fair: 1 when it holds exactly
its fair allocation, above 1 for a borrower, 0 for a starved workspace.

Fair-share preemption (``jobs/preemption.py``) asks how far the shares are from 1 before and
after a preemption; the scheduling simulator (``bench/simulate.py``) computes Jain's index of
the same shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def fair_allocation(
    demand: Mapping[int, float], weight: Mapping[int, float], capacity: float
) -> dict[int, float]:
    """Weighted max-min fair split of ``capacity`` among workspaces with ``demand`` (water
    filling): a workspace gets its demand or its weight's share of what is left, whichever is
    less. A workspace with no demand or no weight gets nothing (it is not in the answer)."""
    alloc: dict[int, float] = {}
    active = {ws for ws, need in demand.items() if need > 0 and weight.get(ws, 0) > 0}
    left = capacity
    while active:
        level = left / sum(weight[ws] for ws in active)
        satisfied = {ws for ws in active if demand[ws] <= level * weight[ws]}
        if not satisfied:
            alloc.update({ws: level * weight[ws] for ws in active})
            break
        for ws in satisfied:
            alloc[ws] = demand[ws]
            left -= demand[ws]
        active -= satisfied
    return alloc


def unfairness(
    held: Mapping[int, float], fair: Mapping[int, float], workspaces: Iterable[int]
) -> float:
    """Σ (held ÷ fair − 1)² over ``workspaces``: how far their normalised shares are from 1.
    With the total held unchanged, lowering it raises Jain's index of the shares."""
    return sum((held.get(ws, 0.0) / fair[ws] - 1.0) ** 2 for ws in workspaces)
