"""GPU flavors through the quota tree, on its arithmetic alone (no database): three levels of
groups with per-flavor guarantees, limits and lending limits — a group's h100 limit binding a
workspace below it, borrowing a sibling's idle h100 guarantee as far as its lending limit lets
it, preemption taking h100 back only from h100 holders, per-flavor budgets.

The tree (h100 and a100 on a target that has plenty of both; the organisation has 16 h100):

    org (h100 16)
    ├── div-1   h100 guaranteed 8, limit 8
    │   ├── team-1  h100 guaranteed 4, limit 6          A, B
    │   └── team-2  h100 guaranteed 4, lending limit 2  C
    └── div-2   h100 guaranteed 8
        └── team-3  h100 guaranteed 8                   E, F
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from quotas.flavors import FlavorBook, Pool
from quotas.ledger import Held, Ledger, Usage, victims_for
from quotas.models import OrgQuota, QuotaGroup, WorkspaceQuota

A, B, C, E, F = 1, 2, 3, 5, 6
DIV1, DIV2, TEAM1, TEAM2, TEAM3 = 10, 20, 11, 12, 21
POOL = Pool("target:1:k8s", "compute target k8s", {"h100": None, "a100": None})


@dataclasses.dataclass
class Claim:
    pk: int
    workspace_id: int
    requested: dict[str, float]
    gpu_flavors: tuple[str, ...] = ("h100",)
    max_runtime_seconds: int = 3600


def gpu(n: float) -> dict[str, float]:
    return {"cpu": 0.0, "memory_gb": 0.0, "gpu": n, "disk_gb": 0.0}


def group(pk, name, parent=None, **flavors):
    return QuotaGroup(pk=pk, name=name, parent_id=parent, gpu_flavors=flavors)


def h100(guaranteed=0.0, limit=None, lending=None):
    return {"guaranteed": guaranteed, "limit": limit, "lending_limit": lending}


def book(held, ws_flavors=None, **org_capacity) -> Ledger:
    """A ledger of the tree above: ``held`` is {workspace: {flavor: GPUs}}, one job each."""
    groups = {
        g.pk: g
        for g in (
            group(DIV1, "div-1", h100=h100(8, 8)),
            group(DIV2, "div-2", h100=h100(8)),
            group(TEAM1, "team-1", DIV1, h100=h100(4, 6)),
            group(TEAM2, "team-2", DIV1, h100=h100(4, lending=2)),
            group(TEAM3, "team-3", DIV2, h100=h100(8)),
        )
    }
    placed = {A: TEAM1, B: TEAM1, C: TEAM2, E: TEAM3, F: TEAM3}
    ws_flavors = ws_flavors or {}
    ws_quotas = {
        ws: WorkspaceQuota(workspace_id=ws, group_id=g, gpu_flavors=ws_flavors.get(ws, {}))
        for ws, g in placed.items()
    }
    flavors = FlavorBook(
        org_capacity={"h100": 16, **org_capacity},
        ws_quotas={ws: q.gpu_flavors for ws, q in ws_quotas.items() if q.gpu_flavors},
        pools=dict.fromkeys(placed, POOL),
    )
    ws, total = defaultdict(Usage), Usage()
    for workspace_id, by_flavor in held.items():
        for flavor, amount in by_flavor.items():
            ws[workspace_id].add(gpu(amount))
            total.add(gpu(amount))
            flavors.org_held[flavor] += amount
            flavors.ws_held[workspace_id][flavor] += amount
    return Ledger(
        org_quota=OrgQuota(),
        ws_quotas=ws_quotas,
        org=total,
        ws=ws,
        groups=groups,
        flavors=flavors,
    )


def test_a_groups_h100_limit_binds_a_workspace_below_it_and_names_group_and_flavor():
    ledger = book({A: {"h100": 4}})
    assert ledger.blocker(Claim(1, B, gpu(3))) == (
        "group 'team-1' GPU flavor h100 limit 6: 4 reserved, this job needs 3"
    )
    assert ledger.blocker(Claim(1, B, gpu(2))) == ""
    # Other flavors are not the group's h100: an a100 job passes, and a job that takes
    # either falls back to a100.
    assert ledger.blocker(Claim(2, B, gpu(3), ("a100",))) == ""
    either = Claim(3, B, gpu(3), ("h100", "a100"))
    assert ledger.blocker(either) == "" and ledger.flavors.flavor_of(either) == "a100"
    # A job over the group's limit can never fit under it.
    assert ledger.flavors.never_fits(Claim(4, A, gpu(7)), "h100") == (
        "quota group 'team-1''s GPU flavor h100 limit is 6, this job needs 7, so it can never fit"
    )
    # Held counts at every level: the division's limit 8 binds team-2.
    ledger = book({A: {"h100": 6}, C: {"h100": 2}})
    assert ledger.blocker(Claim(5, C, gpu(1))) == (
        "group 'div-1' GPU flavor h100 limit 8: 8 reserved, this job needs 1"
    )


def test_borrowing_a_siblings_idle_h100_goes_as_far_as_its_lending_limit():
    # team-2 is idle and lends 2 of its 4: team-1 (guaranteed 4) may borrow those 2, up to
    # 6 in all, but not the 2 team-2 keeps, though div-1's limit 8 would allow them.
    ledger = book({A: {"h100": 4}})
    ledger.groups[TEAM1].gpu_flavors = {"h100": h100(4)}  # no limit of its own: div-1's binds
    assert ledger.blocker(Claim(1, B, gpu(2))) == ""
    ledger.hold(Claim(1, B, gpu(2)))
    assert ledger.flavors.group_borrowing(TEAM1, "h100")
    assert ledger.blocker(Claim(2, B, gpu(1))) == (
        "group 'div-1' GPU flavor h100 limit 8: 6 reserved and 2 kept for guarantees that are "
        "not lent, this job needs 1"
    )
    # What team-2 keeps is its own subtree's: C may use it.
    assert ledger.blocker(Claim(3, C, gpu(2))) == ""
    # Without the lending limit, team-1 would borrow all of team-2's idle guarantee.
    ledger.groups[TEAM2].gpu_flavors = {"h100": h100(4)}
    ledger = book({A: {"h100": 4}, B: {"h100": 2}})
    ledger.groups[TEAM1].gpu_flavors = {"h100": h100(4)}
    ledger.groups[TEAM2].gpu_flavors = {"h100": h100(4)}
    assert ledger.blocker(Claim(4, B, gpu(2))) == ""


def test_a_workspace_keeps_its_flavor_guarantee_unless_its_lending_limit_lends_it():
    # A is guaranteed 2 h100 and lends nothing (the default): div-2 may borrow div-1's idle
    # h100 but not those 2, nor the 2 team-2 keeps.
    kept = {A: {"h100": {"guaranteed": 2, "limit": None}}}
    ledger = book({E: {"h100": 8}, F: {"h100": 2}}, ws_flavors=kept)
    assert ledger.blocker(Claim(1, F, gpu(2))) == ""
    ledger.hold(Claim(1, F, gpu(2)))
    assert ledger.blocker(Claim(2, F, gpu(1))) == (
        "organisation GPU flavor h100 capacity 16: 12 reserved and 4 kept for guarantees that "
        "are not lent, this job needs 1"
    )
    lent = {A: {"h100": {"guaranteed": 2, "limit": None, "lending_limit": 2}}}
    ledger = book({E: {"h100": 8}, F: {"h100": 4}}, ws_flavors=lent)
    assert ledger.blocker(Claim(2, F, gpu(2))) == ""
    ledger.hold(Claim(2, F, gpu(2)))
    assert ledger.blocker(Claim(3, F, gpu(1))) != ""  # team-2's 2 stay kept


def held(job_id, ws, amount, flavor, priority=5):
    return Held(job_id, ws, priority, None, gpu(amount), gpu_flavor=flavor)


def test_preemption_across_groups_reclaims_h100_only_from_h100_holders():
    # A is guaranteed 2 h100 and lends them: div-2 borrowed them (E holds 6 and F 4, 2 beyond
    # div-2's 8), and E borrows a100 too. A's h100 job takes an h100 job of E back; E's a100
    # job, first in preemption order, stays: it would free no h100.
    lent = {A: {"h100": {"guaranteed": 2, "limit": None, "lending_limit": 2}}}
    ledger = book(
        {E: {"h100": 6, "a100": 4}, F: {"h100": 4}, C: {"h100": 2}, B: {"h100": 2}},
        ws_flavors=lent,
        a100=4,
    )
    ledger.flavors.org_capacity["h100"] = 14
    claim = Claim(1, A, gpu(2))
    assert ledger.within_guarantee(claim)
    assert ledger.reclaimable_blocker(claim).startswith("organisation GPU flavor h100 capacity")
    assert ledger.flavors.reclaimable(claim) == ("h100", {None})
    candidates = [held(40, E, 4, "a100", 0), held(41, E, 2, "h100", 1), held(60, F, 2, "h100", 1)]
    # F is within its guarantee... of nothing: team-3 and div-2 borrow, so F's job would do
    # too, but E's comes first in the order given.
    victims = victims_for(ledger, claim, candidates)
    assert [v.job_id for v in victims] == [41]
    assert ledger.blocker(claim) == ""
    # Nobody borrows h100 beyond their guarantee: nothing is taken, the ledger is unchanged.
    ledger = book({E: {"h100": 4, "a100": 4}, F: {"h100": 4}}, ws_flavors=lent, a100=4)
    ledger.flavors.org_capacity["h100"] = 8
    before = dict(ledger.flavors.org_held)
    claim = Claim(2, A, gpu(2))
    assert victims_for(ledger, claim, [held(40, E, 4, "a100", 0), held(50, E, 4, "h100")]) is None
    assert dict(ledger.flavors.org_held) == before


def test_a_claim_beyond_its_workspaces_flavor_guarantee_preempts_nobody():
    ledger = book({E: {"h100": 12}}, ws_flavors={A: {"h100": {"guaranteed": 2, "limit": None}}})
    ledger.flavors.org_capacity["h100"] = 12
    assert not ledger.within_guarantee(Claim(1, A, gpu(3)))
    assert ledger.within_guarantee(Claim(1, A, gpu(2)))
    assert ledger.within_guarantee(Claim(1, A, gpu(3), ("h100", "a100")))  # a100 is uncapped


def test_a_flavor_budget_blocks_that_flavor_only():
    budget = {A: {"h100": {"guaranteed": 0, "limit": None, "gpu_hours_per_month": 100}}}
    ledger = book({}, ws_flavors=budget)
    ledger.flavors.hours_used = {A: {"h100": 99.5, "a100": 500}}
    assert ledger.blocker(Claim(1, A, gpu(1), max_runtime_seconds=1800)) == ""
    assert ledger.blocker(Claim(2, A, gpu(1))) == (
        "GPU flavor h100 budget 100 h/month: 99.5 h used, this job may use up to 1 h; it "
        "waits for the next budget period"
    )
    assert ledger.blocker(Claim(3, A, gpu(1), ("a100",))) == ""
    either = Claim(4, A, gpu(1), ("h100", "a100"))
    assert ledger.blocker(either) == "" and ledger.flavors.flavor_of(either) == "a100"
    # Only A's budget: B may use h100 as it likes.
    assert ledger.blocker(Claim(5, B, gpu(1))) == ""
