"""Who is preempted: giving guarantees back to workspaces under theirs, and, where the
organisation asks for it under fair_share, fair allocations to workspaces below theirs
(:func:`_plan_fair`) — within the guarantees jobs have of their own (a minimum runtime) and
without preempting twice for the same need.

Admission (``jobs/admission.py``) calls :func:`plan_preemptions` inside its pass, under its
lock; the arithmetic is ``quotas/ledger.py``'s (:func:`~quotas.ledger.victims_for`). What
happens to a victim is ``jobs/attempts.py``'s ``attempts_preempt`` (a launching one leaves at
once) and ``jobs/preempting.py`` (a running one gets SIGTERM and a grace period first).

Two rules keep a preemption from being planned twice: a job still in its grace period
(``preempting``) is no candidate and its capacity counts as already leaving, and a queued job
whose victims are still leaving (:func:`promised_jobs`) is counted as admitted (the capacity is
promised to it) and plans nothing more.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Collection, Mapping

from django.db import connection
from django.db.models import F, IntegerField, OuterRef, Subquery, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Least

from quotas import selectors as quota_selectors
from quotas.fairness import fair_allocation, unfairness
from quotas.ledger import EPSILON, Held, Ledger, victims_for
from quotas.models import RESOURCES
from quotas.tree import ROOT
from workspaces.models import Workspace

from .models import ATTEMPT_ACTIVE, Job, JobAttempt, JobState

FAIR_GAIN = 0.25  # the least fall in Σ (held ÷ fair − 1)² a fair-share preemption brings


@dataclasses.dataclass
class Preemption:
    job: Job  # the queued job that gets its guarantee (or its fair share) back
    victims: list[Held]
    for_fairness: bool = False

    @property
    def cause(self) -> str:
        """Why, as the events' data and the preemption metric's ``reason`` label say it."""
        return "fair_share" if self.for_fairness else "guarantee_reclaimed"

    def reason(self) -> str:
        why = (
            "which holds less than its fair share"
            if self.for_fairness
            else "which is under its guarantee"
        )
        return f"preempted for job {self.job.pk} of workspace {self.job.workspace.slug}, {why}"


def preemption_candidates(organization_id: int) -> list[Held]:
    """The organisation's active reservations in preemption order — lowest priority first, then
    the newest admission (it has lost the least work) — each with its minimum runtime (capped
    by the organisation's max_min_runtime_seconds as it is now), when its attempt started
    running, and whether it is already leaving. One query."""
    running_since = Subquery(
        JobAttempt.objects.filter(job=OuterRef("job_id"), state__in=ATTEMPT_ACTIVE)
        .order_by("-number")
        .values("running_at")[:1]
    )
    asked = Cast(KeyTextTransform("min_runtime_seconds", "job__spec"), IntegerField())
    min_runtime = Least(
        Coalesce(asked, Value(0)),
        F("organization__max_min_runtime_seconds"),
        output_field=IntegerField(),
    )
    rows = (
        quota_selectors.active_reservations()
        .filter(organization_id=organization_id)
        .annotate(min_runtime=min_runtime, running_since=running_since)
        .order_by("job__priority", "-created_at", "-job_id")
        .values_list(
            "job_id",
            "workspace_id",
            "job__priority",
            "created_at",
            "min_runtime",
            "running_since",
            "job__state",
            "gpu_flavor",
            *RESOURCES,
        )
    )
    return [
        Held(
            job_id,
            ws_id,
            priority,
            at,
            dict(zip(RESOURCES, amounts, strict=True)),
            min_runtime_seconds=min_runtime or 0,
            running_since=since,
            leaving=state == JobState.PREEMPTING,
            gpu_flavor=flavor,
        )
        for job_id, ws_id, priority, at, min_runtime, since, state, flavor, *amounts in rows
    ]


def promised_jobs(organization_id: int, queued) -> list[Job]:
    """The jobs of ``queued`` (a queryset of the organisation's queued jobs) that preempted
    others still in their grace period: what those hold is promised to them.

    Every admission pass asks, and almost always there are none: the ids are found by one
    plain statement first, and ``queued`` is read only when there are some. That statement
    starts from the organisation's jobs in their grace period (a victim is always of the
    claimant's organisation), read first whatever the planner's statistics say: started from
    the queued side, as PostgreSQL planned it when a fast-grown queue was not yet analysed, it
    walked every queued job (116 ms a pass at 100,000 queued, against 5 ms at 10,000)."""
    with connection.cursor() as cursor:
        cursor.execute(*promised_statement(organization_id))
        ids = {row[0] for row in cursor.fetchall()}
    return list(queued.filter(pk__in=ids)) if ids else []


def promised_statement(organization_id: int) -> tuple[str, list]:
    """The statement :func:`promised_jobs` runs: the ids of the queued jobs of the organisation
    that jobs in their grace period were preempted for."""
    attempts, jobs = JobAttempt._meta.db_table, Job._meta.db_table
    active = sorted(ATTEMPT_ACTIVE)
    sql = (
        f"WITH leaving AS MATERIALIZED (SELECT id FROM {jobs} "
        "WHERE organization_id = %s AND state = %s) "
        f"SELECT a.preempted_for_id FROM {attempts} a "
        "JOIN leaving ON leaving.id = a.job_id "
        f"JOIN {jobs} promised ON promised.id = a.preempted_for_id "
        f"WHERE a.state IN ({', '.join(['%s'] * len(active))}) AND promised.state = %s"
    )
    return sql, [organization_id, JobState.PREEMPTING, *active, JobState.QUEUED]


class _Candidates:
    """The organisation's preemption candidates, read the first time a planned preemption
    needs them (one query per pass at most). Reading them counts what jobs in their grace
    period hold as already gone from ``ledger``: they are leaving."""

    def __init__(self, ledger: Ledger, organization_id: int, now: dt.datetime):
        self.ledger, self.organization_id, self.now = ledger, organization_id, now
        self.held: list[Held] | None = None

    @property
    def read(self) -> bool:
        return self.held is not None

    def get(self) -> list[Held]:
        if self.held is None:
            self.held = []
            for held in preemption_candidates(self.organization_id):
                if held.leaving:
                    self.ledger.hold(held, -1)  # on its way out already
                elif not held.protected(self.now):
                    self.held.append(held)
        return self.held

    def drop(self, victims: list[Held]) -> None:
        gone = {held.job_id for held in victims}
        self.held = [held for held in self.get() if held.job_id not in gone]


def plan_preemptions(
    ledger: Ledger,
    organization_id: int,
    dealt: Mapping[int, Job],
    *,
    now: dt.datetime,
    fair_after: float | None = None,
) -> list[Preemption]:
    """Give guarantees back: for each workspace whose next queued job (of the organisation's
    queue without ``dealt``, the jobs the pass already admitted or promised, by id) fits within its
    guarantee but not in what is left, preempt running jobs of workspaces above their guarantee
    (borrowers) until it fits. One job per workspace per pass; the requeued victims trigger the
    next pass. Victims never come from a workspace within its guarantee, and a job that fits
    within its own guarantee can never be one, so two workspaces cannot preempt each other.

    What jobs in their grace period hold counts as already free here (they are leaving), so a
    job that fits once they are gone preempts nobody more and waits (it is held in ``ledger``,
    so a second workspace does not count the same capacity). A job within its minimum runtime
    (:meth:`~quotas.ledger.Held.protected`) is never a victim: others may be chosen instead.
    A job short of a GPU flavor it is guaranteed (at a group or the organisation) takes only
    jobs that hold that flavor and borrow it (``quotas.ledger.victims_for``).

    With ``fair_after`` (seconds; the organisation's fair-share preemption), the heads that
    have waited longer than that and are still kept out only by the organisation's capacity
    then preempt for fairness (:func:`_plan_fair`).
    ``ledger`` is updated as if every victim had left and every planned job were admitted."""
    preemptions: list[Preemption] = []
    candidates = _Candidates(ledger, organization_id, now)
    for workspace_id in list(ledger.ws_quotas) if ledger.anyone_borrowing() else []:
        if not ledger.under_guarantee(workspace_id):
            continue  # at or above its guarantee: it has nothing to take back
        job = _waiting(workspace_id, dealt).select_related("workspace").first()
        if job is None or not ledger.within_guarantee(job) or ledger.workspace_blocker(job):
            continue
        if not ledger.reclaimable_blocker(job):
            if candidates.read:
                ledger.hold(job)  # it fits in what is leaving: nobody else counts that
            continue  # it fits without anyone else leaving (or the policy held it back)
        if not candidates.read:
            candidates.get()
            if not ledger.reclaimable_blocker(job):
                ledger.hold(job)  # room once the leaving jobs are gone: it waits for them
                continue
        victims = victims_for(ledger, job, candidates.get())
        if victims is None:
            continue
        ledger.hold(job)
        preemptions.append(Preemption(job, victims))
        candidates.drop(victims)
    if fair_after is not None:
        planned = {preemption.job.pk: preemption.job for preemption in preemptions}
        preemptions += _plan_fair(
            ledger,
            organization_id,
            {**dealt, **planned},
            candidates,
            now,
            now - dt.timedelta(seconds=fair_after),
        )
    return preemptions


# --- fair-share preemption -------------------------------------------------------------------


def _plan_fair(
    ledger: Ledger,
    organization_id: int,
    dealt: Mapping[int, Job],
    candidates: _Candidates,
    now: dt.datetime,
    cutoff: dt.datetime,
) -> list[Preemption]:
    """Preempt for fairness (Kueue's fair-sharing preemption): each workspace's next job that
    was queued before ``cutoff`` and is kept out only by the organisation's capacity (not by
    its own limits, a group's, the host's or a GPU flavor's) may preempt jobs of workspaces
    that hold more than their fair allocation (``quotas/fairness.py``) of a resource it is
    short of — the most over it first, each victim's priority at most the claimant's — when

    - that brings the workspaces closer to their fair allocations: Σ (held ÷ fair − 1)², over
      the workspaces and the capped resources, falls by at least :data:`FAIR_GAIN`; and
    - the policy agrees: the claimant's fair-share key once admitted is at most each victim
      workspace's once its victims are gone (Kueue's ``LessThanOrEqualToFinalShare``).

    The second rule keeps the two orders from passing jobs back and forth: without it, a
    workspace over its fair allocation now but with a low key (it used little in the past)
    was given back by the policy what preemption had taken from it, and lost it again — one
    job was preempted 80 times in a replay. With it, a victim's workspace cannot preempt the
    claimant back (its key would have to be below the claimant's, which is below its own).
    Starved workspaces come first; one job per workspace per pass."""
    capped = [
        name
        for name in RESOURCES
        if ledger.org_quota is not None and getattr(ledger.org_quota, name) is not None
    ]
    if not any(_may_be_over_fair(ledger, name) for name in capped):
        return []  # nobody can be a victim: the queue is not read
    if not _queued_before(organization_id, cutoff):
        return []  # nobody has waited long enough to claim
    heads = workspace_heads(organization_id, dealt)
    fair = fair_allocations(ledger, heads, dealt, capped)
    heads = [job for job in heads if job.queued_at < cutoff]
    preemptions: list[Preemption] = []
    for job in sorted(heads, key=lambda job: _share(ledger, fair, job.workspace_id)):
        short = _org_short(ledger, job)
        if not short or any(job.workspace_id not in fair[name] for name in short):
            continue  # not kept out by the capacity alone, or owed none of what it lacks
        victims = _fair_victims(ledger, job, candidates.get(), fair, short, now)
        if victims:
            preemptions.append(Preemption(job, victims, for_fairness=True))
            candidates.drop(victims)
    return preemptions


def _queued_before(organization_id: int, cutoff: dt.datetime) -> bool:
    """Whether a job of the organisation's queue was queued before ``cutoff`` (a job this pass
    already admitted or planned may count: the reads that follow leave those out)."""
    with connection.cursor() as cursor:
        cursor.execute(*overdue_statement(organization_id, cutoff))
        return bool(cursor.fetchone()[0])


def overdue_statement(organization_id: int, cutoff: dt.datetime) -> tuple[str, list]:
    """The statement :func:`_queued_before` runs. The queue's index orders by priority before
    the time queued, so "anyone queued before the cutoff" read as one range walked the whole
    queue when nobody was (8.7 ms a pass at 94,000 queued): this finds the queue's priorities
    one index probe at a time (a loose index scan), then asks each for its oldest job."""
    jobs = Job._meta.db_table
    queue = f"FROM {jobs} WHERE organization_id = %s AND state = %s"
    # Scalar subqueries in index order, each its own probe: with MAX() or a join, PostgreSQL
    # holding stale statistics (a queue grown fast) chose plans that read the whole queue.
    below = f"SELECT priority {queue} AND priority < levels.priority ORDER BY priority DESC LIMIT 1"
    sql = (
        "WITH RECURSIVE levels(priority) AS ("
        f"SELECT (SELECT priority {queue} ORDER BY priority DESC LIMIT 1) "
        f"UNION ALL SELECT ({below}) FROM levels WHERE levels.priority IS NOT NULL) "
        "SELECT EXISTS (SELECT 1 FROM levels WHERE "
        f"(SELECT queued_at {queue} AND priority = levels.priority ORDER BY queued_at LIMIT 1)"
        " < %s)"
    )
    on_queue = [organization_id, JobState.QUEUED]
    when = connection.ops.adapt_datetimefield_value(cutoff)
    return sql, [*on_queue, *on_queue, *on_queue, when]


def _may_be_over_fair(ledger: Ledger, name: str) -> bool:
    """Whether some workspace may hold more than its fair allocation of ``name``, known from
    what is held alone: a fair allocation is never less than what the workspace wants or its
    guarantee's share of the capacity (water filling only raises the level as workspaces are
    satisfied), so a workspace that holds no more than that share is not above it. One that
    holds some without a guarantee of it may be."""
    capacity = getattr(ledger.org_quota, name)
    total = sum(ledger.guarantee(ws)[name] for ws in ledger.ws_quotas)
    for ws, usage in list(ledger.ws.items()):
        held = getattr(usage, name)
        if held <= EPSILON:
            continue
        guaranteed = ledger.guarantee(ws)[name]
        if total <= 0 or guaranteed <= 0 or held > capacity * guaranteed / total + EPSILON:
            return True
    return False


def _org_short(ledger: Ledger, job: Job) -> list[str]:
    """The resources the organisation is short of for ``job`` when its capacity is all that
    keeps the job out (none otherwise)."""
    if ledger.workspace_blocker(job) or ledger.host_blocker(job) or ledger.flavor_blocker(job):
        return []
    shortages = list(ledger.shortages(job))
    if not shortages or any(node is not ROOT or name == "running" for node, name, _ in shortages):
        return []
    return [name for _, name, _ in shortages]


def _fair(
    ledger: Ledger,
    demand: dict[int, dict[str, float]],
    name: str,
    unbounded: Collection[int] = (),
) -> dict[int, float]:
    """Each workspace's fair allocation of ``name``: its demand is what it holds and what it
    has queued (without bound for the workspaces in ``unbounded``), its weight its guarantee
    (equal weights when nobody is guaranteed any)."""
    wants = {
        ws: getattr(usage, name) + demand.get(ws, {}).get(name, 0.0)
        for ws, usage in ledger.ws.items()
    }
    for ws, amounts in demand.items():
        wants.setdefault(ws, amounts[name])
    for ws in unbounded:
        wants[ws] = math.inf
    weight = {ws: ledger.guarantee(ws)[name] for ws in wants}  # 0 without a quota row
    if not any(weight.values()):
        weight = dict.fromkeys(wants, 1.0)
    capacity = getattr(ledger.org_quota, name)
    return fair_allocation(wants, weight, capacity)


def _held(ledger: Ledger, name: str) -> dict[int, float]:
    return {ws: getattr(usage, name) for ws, usage in ledger.ws.items()}


def _share(ledger: Ledger, fair: dict[str, dict[int, float]], workspace_id: int) -> float:
    """The workspace's largest held ÷ fair over the resources in ``fair`` (∞ with no fair
    allocation of one it holds)."""
    shares = [0.0]
    for name, allocation in fair.items():
        held = getattr(ledger.ws[workspace_id], name) if workspace_id in ledger.ws else 0.0
        if workspace_id in allocation:
            shares.append(held / allocation[workspace_id])
        elif held > EPSILON:
            shares.append(math.inf)
    return max(shares)


def _distance(ledger: Ledger, fair: dict[str, dict[int, float]]) -> float:
    """Σ (held ÷ fair − 1)² over every workspace with a fair allocation, every resource."""
    return sum(
        unfairness(_held(ledger, name), allocation, allocation) for name, allocation in fair.items()
    )


def _fair_victims(
    ledger: Ledger,
    job: Job,
    candidates: list[Held],
    fair: dict[str, dict[int, float]],
    short: list[str],
    now: dt.datetime,
) -> list[Held] | None:
    """The victims whose release lets ``job`` in (it is short of ``short``) under the rules of
    :func:`_plan_fair` (``ledger`` is updated as if they left and ``job`` were admitted), or
    None (then nothing changes)."""
    ws_id, lacking = job.workspace_id, {name: fair[name] for name in short}
    ledger.hold(job)
    claimant_key = ledger.fair_share_path_key(ws_id, now)
    ledger.hold(job, -1)
    useful = [
        held
        for held in candidates
        if held.workspace_id != ws_id
        and held.priority <= job.priority
        and any(held.requested[name] > 0 for name in short)
    ]
    chosen: list[Held] = []
    while ledger.blocker(job) and useful:
        shares = {ws: _share(ledger, lacking, ws) for ws in {held.workspace_id for held in useful}}
        # The workspace most over its fair allocation of what the job lacks gives first;
        # within it, the order given (lowest priority, then the newest admission).
        victim = max(useful, key=lambda held: shares[held.workspace_id])
        if shares[victim.workspace_id] <= 1 + EPSILON:
            break  # nobody left above their fair allocation
        useful.remove(victim)
        ledger.hold(victim, -1)
        if ledger.fair_share_path_key(victim.workspace_id, now) < claimant_key:
            ledger.hold(victim)  # the policy would put its workspace first again
            continue
        chosen.append(victim)
    fits = bool(chosen) and not ledger.blocker(job)
    for held in chosen:
        ledger.hold(held)
    if not fits:
        return None
    before = _distance(ledger, fair)
    for held in chosen:
        ledger.hold(held, -1)
    ledger.hold(job)
    if before - _distance(ledger, fair) >= FAIR_GAIN:
        return chosen
    ledger.hold(job, -1)
    for held in chosen:
        ledger.hold(held)
    return None


def _waiting(workspace_id, dealt: Collection[int]):
    """A workspace's queued jobs but ``dealt``, in base order: read through the workspace's
    queue index (the organisation's would walk every workspace's queue to find one's)."""
    return (
        Job.objects.filter(workspace_id=workspace_id, state=JobState.QUEUED)
        .exclude(pk__in=list(dealt))
        .order_by("-priority", "queued_at", "id")
    )


def workspace_heads(organization_id: int, dealt: Collection[int]) -> list[Job]:
    """Each workspace's next queued job but ``dealt`` (in base order: priority, then time
    queued): one query, an index probe per workspace of the organisation, however long their
    queues (a window over the queue sorted all of it)."""
    ids = [pk for pk in heads_query(organization_id, dealt) if pk is not None]
    # Read by id in a statement of their own: as a subquery of the jobs' read, PostgreSQL with
    # statistics that had not seen a fast-grown queue yet read every job to match them.
    return list(Job.objects.filter(pk__in=ids).select_related("workspace").order_by("id"))


def heads_query(organization_id: int, dealt: Collection[int]):
    """The ids of the heads: the organisation's workspaces, each with its first queued job."""
    first = _waiting(OuterRef("pk"), dealt).values("pk")[:1]
    heads = Workspace.objects.filter(organization_id=organization_id).annotate(head=Subquery(first))
    return heads.order_by().values_list("head", flat=True)


DEMAND_CHUNK = 16  # queued jobs per workspace the first read sums; each further read 8 × more


def fair_allocations(
    ledger: Ledger, heads: list[Job], dealt: Mapping[int, Job], names: list[str]
) -> dict[str, dict[int, float]]:
    """Each workspace's fair allocation of each of ``names`` (:func:`_fair`), with the queues of
    the workspaces of ``heads`` (those with a job waiting but ``dealt``) read only as far as the
    allocation depends on them.

    A workspace's demand matters only up to what water filling would give it: once the jobs
    read of its queue add up to more than it would get were its queue endless, the rest cannot
    change anyone's allocation (the level only rises as workspaces are satisfied, so one still
    wanting more at the last level wanted more at every level before). So each workspace's
    queue is summed over its first :data:`DEMAND_CHUNK` jobs (an index probe each, one
    statement), the allocations are worked out with the workspaces read only in part taken as
    wanting without end (until their queue is read whole: another workspace read further may
    raise the level past what was read of theirs), and the queues of those that would get more
    than was read are read again, 8 times as far, until none would. A pass's cost follows the
    workspaces and what they may get, not the length of their queues (a sum grouped over the
    queue read all of it). ``dealt`` jobs are still queued in the table: their requests are
    taken off."""
    taken: dict[int, dict[str, float]] = {}
    for job in dealt.values():
        amounts = taken.setdefault(job.workspace_id, dict.fromkeys(names, 0.0))
        for name in names:
            amounts[name] += getattr(job, f"requested_{name}")
    demand: dict[int, dict[str, float]] = {}
    held = {name: _held(ledger, name) for name in names}
    partial: set[int] = set()  # read in part: taken as wanting without end, whatever was read
    pending, limit = sorted({job.workspace_id for job in heads}), DEMAND_CHUNK
    while True:
        for ws, count, *sums in _queue_sums(pending, names, limit) if pending else ():
            off = taken.get(ws, {})
            demand[ws] = {
                name: max(0.0, float(total or 0) - off.get(name, 0.0))
                for name, total in zip(names, sums, strict=True)
            }
            if count < limit:
                partial.discard(ws)
            else:
                partial.add(ws)
        fair = {name: _fair(ledger, demand, name, partial) for name in names}
        pending = sorted(
            ws
            for ws in partial
            if any(
                fair[name].get(ws, 0.0) > held[name].get(ws, 0.0) + demand[ws][name] + EPSILON
                for name in names
            )
        )
        if not pending:
            return fair
        limit *= 8


def _queue_sums(workspace_ids: list[int], names: list[str], limit: int) -> list[tuple]:
    """For each workspace: how many of its queued jobs were read (at most ``limit``) and the
    sum of their requests of each of ``names``, each sum over at most ``limit`` of them (an
    index probe per workspace and sum). Which jobs does not matter: all of them when fewer
    than ``limit`` are queued, else a part that only bounds the whole from below."""
    with connection.cursor() as cursor:
        cursor.execute(*queue_sums_statement(workspace_ids, names, limit))
        return cursor.fetchall()


def queue_sums_statement(
    workspace_ids: list[int], names: list[str], limit: int
) -> tuple[str, list]:
    """The statement :func:`_queue_sums` runs."""
    jobs, workspaces = Job._meta.db_table, Workspace._meta.db_table
    first = f"FROM {jobs} j WHERE j.workspace_id = w.id AND j.state = %s LIMIT %s"
    columns = [f"(SELECT COUNT(*) FROM (SELECT 1 {first}) t)"] + [
        f"(SELECT SUM(t.v) FROM (SELECT j.requested_{name} AS v {first}) t)" for name in names
    ]
    sql = (
        f"SELECT w.id, {', '.join(columns)} FROM {workspaces} w "
        f"WHERE w.id IN ({', '.join(['%s'] * len(workspace_ids))})"
    )
    return sql, [JobState.QUEUED, limit] * len(columns) + list(workspace_ids)
