"""The quota tree's arithmetic on its own (no database): three levels of groups between the
organisation and its workspaces — borrowing within and across levels, a group's limit binding,
lending limits, preemption's nearest borrowers, hierarchical fair share.

The tree (GPUs; the organisation has 16):

    org (16)
    ├── div-1   guaranteed 8, limit 12
    │   ├── team-1  guaranteed 4, limit 8     A (2), B (2)
    │   └── team-2  guaranteed 4              C (4)
    └── div-2   guaranteed 8
        └── team-3  guaranteed 8              E (4), F (4)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict

import pytest

from quotas.ledger import Held, Ledger, PastUsage, Usage, victims_for
from quotas.models import OrgQuota, QuotaGroup, WorkspaceQuota

A, B, C, E, F = 1, 2, 3, 5, 6
DIV1, DIV2, TEAM1, TEAM2, TEAM3 = 10, 20, 11, 12, 21


@dataclasses.dataclass
class Claim:
    pk: int
    workspace_id: int
    requested: dict[str, float]
    max_runtime_seconds: int = 3600


def gpu(n: float) -> dict[str, float]:
    return {"cpu": 0.0, "memory_gb": 0.0, "gpu": n, "disk_gb": 0.0}


def group(pk, name, parent=None, guaranteed=0.0, limit=None, lending=None, weight=1.0):
    return QuotaGroup(
        pk=pk,
        name=name,
        parent_id=parent,
        guaranteed_gpu=guaranteed,
        limit_gpu=limit,
        lending_limit_gpu=lending,
        fair_share_weight=weight,
    )


def book(held: dict[int, float], lending: dict[int, float] | None = None, **org) -> Ledger:
    """A ledger of the tree above, ``held`` GPUs per workspace (one job each)."""
    lending = lending or {}
    groups = {
        g.pk: g
        for g in (
            group(DIV1, "div-1", guaranteed=8, limit=12, lending=lending.get(DIV1)),
            group(DIV2, "div-2", guaranteed=8, lending=lending.get(DIV2)),
            group(TEAM1, "team-1", DIV1, guaranteed=4, limit=8, lending=lending.get(TEAM1)),
            group(TEAM2, "team-2", DIV1, guaranteed=4, lending=lending.get(TEAM2)),
            group(TEAM3, "team-3", DIV2, guaranteed=8, lending=lending.get(TEAM3)),
        )
    }
    placed = {A: (TEAM1, 2), B: (TEAM1, 2), C: (TEAM2, 4), E: (TEAM3, 4), F: (TEAM3, 4)}
    ws_quotas = {
        ws: WorkspaceQuota(
            workspace_id=ws,
            group_id=g,
            guaranteed_gpu=guaranteed,
            lending_limit_gpu=lending.get(ws),
        )
        for ws, (g, guaranteed) in placed.items()
    }
    ws, total = defaultdict(Usage), Usage()
    for workspace_id, amount in held.items():
        ws[workspace_id].add(gpu(amount))
        total.add(gpu(amount))
    return Ledger(
        org_quota=OrgQuota(gpu=16, **org),
        ws_quotas=ws_quotas,
        org=total,
        ws=ws,
        groups=groups,
    )


def test_a_group_counts_what_its_subtree_holds():
    ledger = book({A: 3, B: 1, C: 2, E: 1})
    usage = {g: ledger.tree.usage[g].gpu for g in (TEAM1, TEAM2, DIV1, TEAM3, DIV2)}
    assert usage == {TEAM1: 4, TEAM2: 2, DIV1: 6, TEAM3: 1, DIV2: 1}
    assert ledger.tree.usage[DIV1].running == 3
    ledger.hold(Claim(1, B, gpu(2)))
    assert (ledger.tree.usage[TEAM1].gpu, ledger.tree.usage[DIV1].gpu, ledger.org.gpu) == (6, 8, 9)
    ledger.hold(Claim(1, B, gpu(2)), -1)
    assert (ledger.tree.usage[TEAM1].gpu, ledger.tree.usage[DIV1].gpu) == (4, 6)


def test_borrowing_within_a_team_and_across_levels():
    # Within team-1: A borrows B's idle guarantee (4 > its 2).
    ledger = book({})
    assert ledger.blocker(Claim(1, A, gpu(4))) == ""
    ledger.hold(Claim(1, A, gpu(4)))
    assert ledger.borrowing(A, "gpu") and not ledger.tree.borrowing(TEAM1, "gpu")
    # Across levels: team-1 up to its limit 8 takes team-2's idle guarantee, and div-1 goes
    # beyond its guarantee 8 into div-2's idle one.
    ledger.hold(Claim(2, A, gpu(4)))
    assert ledger.tree.borrowing(TEAM1, "gpu") and not ledger.tree.borrowing(DIV1, "gpu")
    assert ledger.blocker(Claim(3, C, gpu(4))) == ""
    ledger.hold(Claim(3, C, gpu(4)))
    assert ledger.tree.usage[DIV1].gpu == 12 and ledger.tree.borrowing(DIV1, "gpu")


def test_a_group_limit_binds_at_every_level_and_names_the_group():
    ledger = book({A: 6})
    assert ledger.blocker(Claim(1, B, gpu(3))) == (
        "group 'team-1' gpu limit 8: 6 reserved, this job needs 3"
    )
    assert ledger.blocker(Claim(1, B, gpu(2))) == ""
    ledger = book({A: 8, C: 3})
    assert ledger.blocker(Claim(1, C, gpu(2))) == (
        "group 'div-1' gpu limit 12: 11 reserved, this job needs 2"
    )
    # div-2 has no limit of its own: the organisation's capacity binds it.
    ledger = book({A: 8, C: 4, E: 3})
    assert ledger.blocker(Claim(1, F, gpu(2))) == (
        "organisation gpu capacity 16: 15 reserved, this job needs 2"
    )


def test_a_group_max_running_jobs_binds():
    ledger = book({A: 1, B: 1})
    ledger.groups[TEAM1].max_running_jobs = 2
    assert ledger.blocker(Claim(1, A, gpu(1))) == "group 'team-1' max_running_jobs 2: 2 running"
    assert ledger.blocker(Claim(1, C, gpu(1))) == ""


def test_a_lending_limit_keeps_the_unlent_part_of_a_guarantee():
    # div-2 lends at most 2 of its 8: 6 stay kept for it, used or not.
    ledger = book({A: 8, C: 2}, lending={DIV2: 2})
    assert ledger.blocker(Claim(1, C, gpu(1))) == (
        "organisation gpu capacity 16: 10 reserved and 6 kept for guarantees that are not "
        "lent, this job needs 1"
    )
    # Its own subtree uses what it keeps.
    assert ledger.blocker(Claim(1, E, gpu(4))) == ""
    ledger.hold(Claim(1, E, gpu(4)))
    assert ledger.blocker(Claim(2, F, gpu(2))) == ""
    ledger.hold(Claim(2, F, gpu(2)))
    assert ledger.blocker(Claim(3, F, gpu(1))) != ""  # 10 + 6 = 16: nothing left anywhere
    # Once div-2 holds more than it keeps, the next of its GPUs is lent again.
    ledger.hold(Claim(1, E, gpu(4)), -1)
    ledger.hold(Claim(2, F, gpu(2)), -1)
    assert ledger.blocker(Claim(4, C, gpu(1))) != ""


def test_a_lending_limit_inside_a_group_binds_the_groups_limit():
    # team-2 keeps 3 of its 4 (lends 1): under div-1's limit 12 team-1 may take 12 - 3 = 9,
    # but its own limit 8 binds first; with team-1 at 8, C still has its 3.
    ledger = book({A: 8}, lending={TEAM2: 1})
    assert ledger.blocker(Claim(1, C, gpu(3))) == ""
    ledger = book({A: 4, B: 4}, lending={TEAM2: 1})
    ledger.groups[TEAM1].limit_gpu = 10
    assert ledger.blocker(Claim(1, A, gpu(1))) == ""
    assert ledger.blocker(Claim(1, A, gpu(2))) == (
        "group 'div-1' gpu limit 12: 8 reserved and 3 kept for guarantees that are not lent, "
        "this job needs 2"
    )


def test_without_lending_limits_the_tree_is_the_two_level_rule():
    flat = Ledger(
        org_quota=OrgQuota(gpu=16),
        ws_quotas={ws: WorkspaceQuota(workspace_id=ws, guaranteed_gpu=2) for ws in (A, B)},
        org=Usage(gpu=15, running=1),
        ws=defaultdict(Usage, {A: Usage(gpu=15, running=1)}),
    )
    tree = book({A: 8, C: 4, E: 3})
    for claim in (Claim(1, B, gpu(1)), Claim(2, B, gpu(2))):
        assert flat.blocker(claim) == tree.blocker(Claim(claim.pk, F, claim.requested)), (
            claim.requested
        )
    assert not tree.tree.keeps and tree.tree.growth(Claim(1, F, gpu(1)), tree.ws[F]) == []


def held(job_id, ws, amount, priority=5):
    return Held(job_id, ws, priority, None, gpu(amount))


def test_preemption_takes_from_the_nearest_borrowers_first():
    # Full: B borrows 2 within team-1 (sibling of A), C borrows 2 (cousin, via div-1), E and F
    # are within their guarantees.
    ledger = book({B: 4, C: 6, E: 3, F: 3})
    claim = Claim(1, A, gpu(2))
    assert ledger.within_guarantee(claim) and ledger.blocker(claim).startswith("organisation")
    # The cousin's job comes first in the given order (lower priority): the sibling still goes.
    candidates = [held(30, C, 2, priority=1), held(20, B, 2, priority=3), held(50, E, 3, 0)]
    victims = victims_for(ledger, claim, candidates)
    assert [v.job_id for v in victims] == [20]


def test_preemption_reaches_cousins_and_other_divisions_but_never_a_node_within_its_guarantee():
    ledger = book({B: 2, C: 6, E: 4, F: 4})  # only C borrows
    candidates = [held(50, E, 4, 0), held(60, F, 4, 0), held(20, B, 2), held(30, C, 2)]
    assert [v.job_id for v in victims_for(ledger, Claim(1, A, gpu(2)), candidates)] == [30]
    # F borrows within team-3 and div-2 borrows from div-1: F's job is taken; E's never.
    ledger = book({B: 2, C: 4, E: 4, F: 6})
    candidates = [held(50, E, 2, 0), held(51, E, 2, 0), held(60, F, 2, 1), held(61, F, 4, 1)]
    assert [v.job_id for v in victims_for(ledger, Claim(1, A, gpu(2)), candidates)] == [60]
    # F borrows, but only what E leaves idle in team-3: div-2 is within its guarantee, so
    # F's borrowing is none of div-1's business.
    ledger = book({A: 0, B: 4, C: 4, E: 2, F: 6})
    ledger.org_quota.gpu = 16
    candidates = [held(60, F, 2, 0), held(20, B, 2, 5)]
    assert [v.job_id for v in victims_for(ledger, Claim(1, A, gpu(2)), candidates)] == [20]
    # Nobody borrows: nothing is taken, and the ledger is as it was.
    ledger = book({A: 0, B: 2, C: 4, E: 4, F: 4})
    ledger.org_quota.gpu = 14
    before = ledger.org.gpu
    assert victims_for(ledger, Claim(1, A, gpu(2)), [held(20, B, 2), held(50, E, 4)]) is None
    assert ledger.org.gpu == before


def test_preemption_frees_a_group_limit_from_inside_the_group():
    # team-1 is at its limit 8 (B borrows 6 of A's... and team-2's): only B's jobs help.
    ledger = book({B: 8, C: 0})
    claim = Claim(1, A, gpu(2))
    assert ledger.blocker(claim).startswith("group 'team-1' gpu limit 8")
    victims = victims_for(ledger, claim, [held(30, C, 0), held(20, B, 2), held(21, B, 2)])
    assert [v.job_id for v in victims] == [20]


def test_fair_share_compares_siblings_at_the_highest_level_first():
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    # div-1 holds 6 of its 8 (0.75), div-2 4 of 8 (0.5): every workspace of div-2 goes first,
    # even F, whose own share (4/4) is above A's (0/2).
    ledger = book({B: 2, C: 4, E: 0, F: 4})
    assert ledger.fair_share_path_key(F, now) < ledger.fair_share_path_key(A, now)
    assert ledger.fair_share_path_key(F, now)[0] == pytest.approx(0.5)
    # Within div-1, team-1 (2 of 4) before team-2 (4 of 4); within team-1, A before B.
    assert ledger.fair_share_path_key(A, now) < ledger.fair_share_path_key(B, now)
    assert ledger.fair_share_path_key(B, now) < ledger.fair_share_path_key(C, now)
    # A weight on a division divides its share among its siblings.
    ledger.groups[DIV1].fair_share_weight = 2
    assert ledger.fair_share_path_key(A, now) < ledger.fair_share_path_key(F, now)
    # Past usage sums up the tree: team-3's history counts against div-2.
    ledger = book({})
    ledger.past = {E: PastUsage({"gpu": 8 * 86_400.0}, now)}
    assert ledger.group_share(DIV2, now)[1] > 0 and ledger.group_share(DIV1, now)[1] == 0
    assert ledger.fair_share_path_key(A, now) < ledger.fair_share_path_key(F, now)
