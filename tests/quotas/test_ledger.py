"""The admission arithmetic on its own: no database, no jobs — claims are plain values."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict

from quotas.ledger import Held, Ledger, Usage, budget_overrun, month_start, victims_for
from quotas.models import OrgQuota, WorkspaceQuota

A, B = 1, 2  # two workspaces of one organisation


@dataclasses.dataclass
class Claim:
    pk: int
    workspace_id: int
    requested: dict[str, float]
    max_runtime_seconds: int = 3600


def cpu(n: float, gpu: float = 0) -> dict[str, float]:
    return {"cpu": n, "memory_gb": 0.0, "gpu": gpu, "disk_gb": 0.0}


def ledger(capacity: float, guarantees: dict[int, float], held: dict[int, float]) -> Ledger:
    ws = defaultdict(Usage)
    org = Usage()
    for workspace_id, amount in held.items():
        ws[workspace_id].add(cpu(amount))
        org.add(cpu(amount))
    return Ledger(
        org_quota=OrgQuota(cpu=capacity),
        ws_quotas={
            w: WorkspaceQuota(workspace_id=w, guaranteed_cpu=g) for w, g in guarantees.items()
        },
        org=org,
        ws=ws,
    )


def test_a_claim_fits_until_the_capacity_is_held():
    book = ledger(capacity=4, guarantees={A: 2, B: 2}, held={A: 3})
    assert book.blocker(Claim(1, B, cpu(1))) == ""
    book.hold(Claim(1, B, cpu(1)))
    assert book.blocker(Claim(2, B, cpu(1))) == (
        "organisation cpu capacity 4: 4 reserved, this job needs 1"
    )
    assert book.org.running == 2 and book.ws[B].cpu == 1


def test_float_amounts_that_add_up_exactly_still_fit():
    book = ledger(capacity=0.3, guarantees={}, held={A: 0.1})
    assert book.blocker(Claim(1, A, cpu(0.2))) == ""


def test_a_workspace_limit_blocks_before_the_organisation():
    book = ledger(capacity=10, guarantees={A: 1}, held={A: 2})
    book.ws_quotas[A].limit_cpu = 2
    assert book.blocker(Claim(1, A, cpu(1))).startswith("workspace cpu limit 2")


def test_borrowing_and_guarantees():
    book = ledger(capacity=4, guarantees={A: 2, B: 2}, held={A: 4})
    assert book.borrowing(A, "cpu") and not book.borrowing(B, "cpu")
    assert book.anyone_borrowing()
    assert book.under_guarantee(B) and not book.under_guarantee(A)
    assert book.within_guarantee(Claim(1, B, cpu(2)))
    assert not book.within_guarantee(Claim(1, B, cpu(3)))


def test_victims_are_taken_only_from_borrowers_and_only_as_many_as_needed():
    book = ledger(capacity=4, guarantees={A: 2, B: 2}, held={A: 4})
    candidates = [Held(job, A, 0, None, cpu(1)) for job in (10, 11, 12, 13)]
    victims = victims_for(book, Claim(1, B, cpu(2)), candidates)
    assert [held.job_id for held in victims] == [10, 11]
    assert book.ws[A].cpu == 2  # the ledger no longer counts what the victims held


def test_no_victim_from_a_workspace_within_its_guarantee():
    book = ledger(capacity=4, guarantees={A: 2, B: 2}, held={A: 2, B: 2})
    candidates = [Held(10, A, 0, None, cpu(2))]
    assert victims_for(book, Claim(1, B, cpu(1)), candidates) is None
    assert book.ws[A].cpu == 2  # nothing was released


def test_when_even_every_borrower_would_not_make_room_nothing_is_released():
    book = ledger(capacity=4, guarantees={A: 1, B: 3}, held={A: 4})
    candidates = [Held(10, A, 0, None, cpu(1))]  # A borrows 3 but only this one is offered
    assert victims_for(book, Claim(1, B, cpu(3)), candidates) is None
    assert book.ws[A].cpu == 4


def test_the_gpu_budget_counts_the_worst_case_runtime():
    quota = WorkspaceQuota(gpu_hours_per_month=10)
    assert budget_overrun(quota, used=8, requested_gpu=1, max_runtime_seconds=7200) == ""
    assert budget_overrun(quota, used=8, requested_gpu=2, max_runtime_seconds=3600) == ""
    over = budget_overrun(quota, used=8, requested_gpu=3, max_runtime_seconds=3600)
    assert over == "GPU budget 10 h/month: 8 h used, this job may use up to 3 h"
    assert budget_overrun(quota, used=100, requested_gpu=0, max_runtime_seconds=3600) == ""
    book = ledger(capacity=10, guarantees={A: 0}, held={})
    book.ws_quotas[A].gpu_hours_per_month = 10
    book.gpu_hours_used[A] = 8
    blocked = book.blocker(Claim(1, A, cpu(0, gpu=3)))
    assert blocked.endswith("; it waits for the next budget period")


def test_month_start():
    now = dt.datetime(2026, 12, 3, 19, 48, 30, 12, tzinfo=dt.UTC)
    assert month_start(now) == dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
