"""When will a queued job start: a replay of the organisation's queue on a copy of its ledger.

:func:`predict_start` reads what the organisation holds (``admission.ledger_for``), its running
jobs and its queue, then plays admission forward on a simulated clock: each running job releases
its reservation at its expected end, and at each release the organisation's policy
(``admission.plan``, the function the workers call, over an in-memory queue) admits what fits,
until the job is admitted. The expected run time of a job is the recent history of its template
(how long its succeeded attempts held their reservation, admission to end; its workspace's or
the organisation's when the template has too little), capped by its ``max_runtime_seconds``;
p50 replays with the medians (while the job keeps strict order, a hold's share of a sum of holds,
:func:`_typical`), p90 with the 90th percentiles. A running job's remaining time is
that of the runs in its history that lasted longer than it has run so far; in the p50 replay
the running jobs' ends are spread as the order statistics of a race (:func:`_release_times`).

Two things the queue does not show are replayed as well: jobs still to be submitted (each
workspace keeps submitting at its recent rate, jobs like its recent ones, see
:func:`_arrivals`), which go ahead of the job wherever the policy lets later jobs overtake; and,
under fair_share, the past usage each simulated end adds to its workspace (the order the policy
weighs).

Bounded: it reads a fixed number of queries whatever the queue's length, and simulates at most
:data:`MAX_AHEAD` queued jobs and :data:`MAX_ARRIVALS` future ones. See docs/prediction.md for
what it does not model.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import datetime as dt
import functools
import heapq
import itertools
import logging
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence

from django.conf import settings
from django.core.cache import cache
from django.db.models import F, IntegerField, Q, Window
from django.db.models.fields.json import KT, KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, RowNumber
from django.utils import timezone
from redis.exceptions import RedisError

from quotas import selectors as quota_selectors
from quotas.models import RESOURCES, QueuePolicy

from . import admission
from .local_host import HOST, workspaces_on_host
from .metrics_snapshot import reason_of
from .models import AttemptState, Job, JobAttempt, JobState
from .waiting import NEXT_PASS, NOBODY, Watch

logger = logging.getLogger(__name__)
MAX_AHEAD = 500  # queued jobs simulated; a job further back in the queue gets no prediction
HISTORY_RUNS = 50  # a template's most recent succeeded attempts that make its run-time history
MIN_HISTORY = 3  # fewer runs of a template: its workspace's runs stand in (then the org's)
FALLBACK_RUNTIME = 3600  # seconds, for a job with neither history nor max_runtime_seconds
VIRTUAL_PK = 2**62  # the place in the queue of a job not yet submitted: after every other
# Future submissions: the organisation's submissions of the last ARRIVAL_WINDOW seconds (at most
# ARRIVAL_SAMPLE, the most recent) give each workspace's rate and the jobs it submits; fewer
# than MIN_ARRIVALS say too little about a rate, and none are replayed.
ARRIVAL_WINDOW = 6 * 3600
ARRIVAL_SAMPLE = 300
MIN_ARRIVALS = 10
MAX_ARRIVALS = 300  # future submissions replayed at most: the replay's bound
MAX_PASSED_OVER = 20 * MAX_ARRIVALS  # future submissions that would queue behind the job
# A hold in a sum of holds (_hold_in_a_sum): the median over SUM_SAMPLES means of as many
# draws as holds follow one another, at most MAX_SUM_DRAWS (by then it is close to the mean).
MAX_SUM_DRAWS = 16
SUM_SAMPLES = 101


@dataclasses.dataclass(frozen=True)
class Prediction:
    position: int  # 1-based place in the org's admission order (0 = would be admitted now)
    blocker: str | None  # a reason from the why-waiting set, None if it would be admitted now
    p50: dt.datetime | None  # predicted start, median; None = cannot predict (never fits)
    p90: dt.datetime | None
    why_unknown: str = ""  # when p50 is None: why
    # expected submissions (not yet made) the p50 replay admitted before it: not part of the
    # answer, but what bench/simulate.py --diagnose compares with the jobs that overtook it
    overtakers: int = 0
    # what it would wait for now, in words (jobs.admission.explain's waiting_for), None if it
    # would be admitted now
    waiting_for: str | None = None


@dataclasses.dataclass(frozen=True)
class Runtime:
    """How long a job is expected to hold its reservation, in seconds."""

    p50: float
    p90: float
    cap: float  # its max_runtime_seconds: Manta ends it there
    runs: tuple[float, ...] = ()  # the history it comes from, capped, ascending


@dataclasses.dataclass(frozen=True)
class Running:
    """An active reservation, and when it is expected to be released (seconds from now)."""

    workspace_id: int
    requested: dict[str, float]
    foreign: bool  # another organisation's, on the shared local host: only the host's count
    ends: tuple[float, float]  # (p50, p90)
    gpu_flavor: str = ""  # the GPU flavor it holds
    since: float = 0.0  # when it was admitted, seconds from now (negative: in the past)
    deadline: float = math.inf  # when Manta ends it at the latest (its max_runtime_seconds)


@dataclasses.dataclass(eq=False, slots=True)
class Queued:
    """A queued job as admission weighs it (a ``quotas.ledger.Claim``), held in memory: a
    replay asks what blocks each one at every simulated pass."""

    pk: int
    workspace_id: int
    organization_id: int
    priority: int
    queued_at: dt.datetime
    requested: dict[str, float]
    max_runtime_seconds: int
    template_id: int | None
    state: str = JobState.QUEUED
    gpu_flavors: tuple[str, ...] = ()  # the GPU flavors it accepts, in order (empty: any)


class SimulatedQueue:
    """The queue as :func:`admission.plan` reads it (see ``admission.DatabaseQueue``), held in
    memory in base order."""

    def __init__(self, queued: list[Queued], deadlines: Callable[[], list] = list):
        self.queued = queued
        self.deadlines = deadlines  # what the organisation holds, with deadlines (admission's)

    def jobs(self, workspace_id: int | None = None) -> Iterator[Queued]:
        if workspace_id is None:
            return iter(self.queued)
        return (job for job in self.queued if job.workspace_id == workspace_id)

    def workspace_ids(self) -> Iterable[int]:
        return list(dict.fromkeys(job.workspace_id for job in self.queued))


# --- reads (a fixed number of queries) -----------------------------------------------------


def _quantile(durations: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list."""
    ordered = sorted(durations)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclasses.dataclass(frozen=True)
class History:
    """Seconds that recent succeeded attempts held their reservation (admission to end),
    ascending: per template, and pooled per workspace and for the whole organisation (of the
    templates read), for a template with too few runs of its own."""

    templates: dict[int, list[float]]
    workspaces: dict[int, list[float]]
    everyone: list[float]

    def of(self, template_id: int | None, workspace_id: int) -> list[float] | None:
        """The runs that best stand for a job of ``template_id`` in ``workspace_id``: its
        template's when it has :data:`MIN_HISTORY`, else its workspace's, else the
        organisation's; with fewer everywhere, the most specific there is (None: none)."""
        found = [
            self.templates.get(template_id) if template_id is not None else None,
            self.workspaces.get(workspace_id),
            self.everyone,
        ]
        found = [runs for runs in found if runs]
        enough = (runs for runs in found if len(runs) >= MIN_HISTORY)
        return next(enough, found[0] if found else None)


def template_runtimes(template_ids: Iterable[int]) -> History:
    """The recent run times of the templates: one query for all of them."""
    ids = {pk for pk in template_ids if pk is not None}
    if not ids:
        return History({}, {}, [])
    template = F("job__template_version__template_id")
    rows = (
        JobAttempt.objects.filter(
            state=AttemptState.SUCCEEDED,
            finished_at__isnull=False,
            job__template_version__template_id__in=ids,
        )
        .annotate(
            template_id=template,
            recent=Window(RowNumber(), partition_by=[template], order_by=F("finished_at").desc()),
        )
        .filter(recent__lte=HISTORY_RUNS)
        .values_list("template_id", "job__workspace_id", "created_at", "finished_at")
    )
    templates: dict[int, list[float]] = defaultdict(list)
    workspaces: dict[int, list[float]] = defaultdict(list)
    everyone: list[float] = []
    for template_id, ws_id, created, finished in rows:
        held = max(0.0, (finished - created).total_seconds())
        for runs in (templates[template_id], workspaces[ws_id], everyone):
            runs.append(held)
    for runs in (*templates.values(), *workspaces.values(), everyone):
        runs.sort()
    return History(dict(templates), dict(workspaces), everyone)


def _runtime(runs: list[float] | None, max_runtime: int | None) -> Runtime:
    """A job's expected hold: its history capped by its max runtime; with no history, the max
    runtime itself (the pessimistic answer: no job holds longer)."""
    cap = float(max_runtime or FALLBACK_RUNTIME)
    if not runs:
        return Runtime(cap, cap, cap)
    capped = tuple(min(run, cap) for run in runs)
    return Runtime(_quantile(capped, 0.5), _quantile(capped, 0.9), cap, capped)


@functools.lru_cache(maxsize=4096)  # histories of at most HISTORY_RUNS runs
def _hold_in_a_sum(runs: tuple[float, ...], draws: int) -> float:
    """A hold's share of ``draws`` holds that run one after another (:func:`_typical`): the
    median, over :data:`SUM_SAMPLES` sums (a fixed seed: the same history, the same answer), of
    the mean of ``draws`` holds drawn from the history. With one, about the history's median;
    with many, its mean. A long sum of skewed holds comes to the mean, but a history with one
    months-long run among short ones (OpenB) has a mean few short sums come near."""
    draw = random.Random(0).choice
    means = sorted(sum(draw(runs) for _ in range(draws)) for _ in range(SUM_SAMPLES))
    return means[SUM_SAMPLES // 2] / draws


def _holds_in_a_row(ahead: int, running: int) -> int:
    """How many holds follow one another before a job that keeps strict order starts: the
    jobs ahead of it, spread over the places the running ones hold (at least 1, at most
    :data:`MAX_SUM_DRAWS`)."""
    return max(1, min(MAX_SUM_DRAWS, math.ceil(ahead / max(1, running))))


_TAIL = [(i + 0.5) / HISTORY_RUNS for i in range(HISTORY_RUNS)]  # quantiles of a rest past all runs


def _remaining(runtime: Runtime, elapsed: float) -> list[float]:
    """What a job that has held its reservation for ``elapsed`` seconds may still hold it for,
    ascending: the rest of each run of its history that lasted longer than that (those are the
    runs it can still turn out to be); with no history, its deadline.

    Past every run of its history, the history says nothing of how much longer: the job is
    taken to be in a heavy tail, where what has lasted ``elapsed`` lasts as long again as often
    as not (a Pareto tail of index 1, Gott's estimate: its rest exceeds ``elapsed`` · q ÷ (1 − q)
    with probability 1 − q), capped by its deadline. Until its deadline (OpenB's tasks have
    none below 150 days) every such job was expected to hold for months, and a job waiting
    behind a few of them was predicted to wait months."""
    left = max(0.0, runtime.cap - elapsed)
    longer = runtime.runs[bisect.bisect_right(runtime.runs, elapsed) :]
    if not runtime.runs:
        return [left]
    if not longer:
        return [min(left, elapsed * q / (1 - q)) for q in _TAIL]
    return [run - elapsed for run in longer]


def _release_times(rests: list[list[float]]) -> list[tuple[float, float]]:
    """When each running job (its possible rests, from :func:`_remaining`) is expected to
    release its reservation, at p50 and p90 (seconds from now).

    p90 is each job's own 90th percentile. p50 is not each job's own median: which job ends
    first is a race, and the first of many uncertain ends comes much sooner than the smallest
    of their medians (a job waiting for the next free GPU was predicted to start 2-5 times
    later than it did). The k-th of n ends is put at the median rank of the k-th order
    statistic, (k - 0.3) / (n + 0.4) (Benard's approximation), of all the jobs' rests pooled
    (each job weighing one), and the k-th is the job with the k-th smallest own median. With
    one running job, that is its median."""
    n = len(rests)
    pooled = sorted(
        (rest, 1.0 / len(options)) for options in map(_thinned, rests) for rest in options
    )
    ranked, k, weight = [], 0, 0.0
    for rest, share in pooled:
        weight += share
        while k < n and weight >= (k + 0.7) / (n + 0.4) * n - 1e-9:
            ranked.append(rest)
            k += 1
    ranked += [pooled[-1][0]] * (n - len(ranked)) if pooled else []
    order = sorted(range(n), key=lambda i: (_quantile(rests[i], 0.5), i))
    times: list[tuple[float, float]] = [(0.0, 0.0)] * n
    for rank, i in enumerate(order):
        times[i] = (ranked[rank], _quantile(rests[i], 0.9))
    return times


def _thinned(rests: Sequence[float]) -> Sequence[float]:
    """At most :data:`HISTORY_RUNS` of ``rests`` (ascending): its nearest-rank quantiles at
    1/HISTORY_RUNS, 2/HISTORY_RUNS, … 1 (the median among them). A job whose history falls back
    on its workspace's or organisation's runs has thousands, and the pool of
    :func:`_release_times` stays that of one template's history per job."""
    n, k = len(rests), HISTORY_RUNS
    if n <= k:
        return rests
    return [rests[-(-(i + 1) * n // k) - 1] for i in range(k)]


def _queue(job: Job, now: dt.datetime) -> tuple[list[Queued], Queued | None]:
    """The first :data:`MAX_AHEAD` queued jobs of the organisation in base order with ``job``
    in its place (a job not yet queued goes where it would if queued now: after every job of
    its priority or higher), and the entry that stands for ``job`` in it; None when it is
    further back."""
    org_id = job.organization_id
    rows = (
        admission._scan(admission._queued(org_id))
        .annotate(template_id=F("template_version__template_id"))
        .values_list(
            "pk",
            "workspace_id",
            "priority",
            "queued_at",
            *(f"requested_{name}" for name in RESOURCES),
            "scanned_max_runtime",
            "template_id",
            "scanned_gpu_flavor",
        )[: MAX_AHEAD + 1]
    )
    queue = [
        Queued(
            pk,
            ws_id,
            org_id,
            priority,
            queued_at or now,  # never None for a queued job; a sort key must not be
            dict(zip(RESOURCES, amounts, strict=True)),
            max_runtime or 0,
            template_id,
            gpu_flavors=tuple(flavors or ()),
        )
        for pk, ws_id, priority, queued_at, *amounts, max_runtime, template_id, flavors in rows
    ]
    if job.pk is not None and job.state == JobState.QUEUED:
        queue = queue[:MAX_AHEAD]
        return queue, next((queued for queued in queue if queued.pk == job.pk), None)
    # Pending approval, or not submitted: as if queued now, after every queued job.
    subject = Queued(
        VIRTUAL_PK,
        job.workspace_id,
        org_id,
        job.priority,
        now,
        job.requested,
        job.max_runtime_seconds,
        job.template_version.template_id if job.template_version_id else None,
        gpu_flavors=job.gpu_flavors,
    )
    key = (-subject.priority, now, VIRTUAL_PK)
    ahead = [queued for queued in queue if (-queued.priority, queued.queued_at, queued.pk) < key]
    if len(ahead) >= MAX_AHEAD:
        return ahead, None
    behind = [queued for queued in queue if (-queued.priority, queued.queued_at, queued.pk) > key]
    return [*ahead, subject, *behind][:MAX_AHEAD], subject


def _deadlines(releases: list[tuple], now: dt.datetime) -> list[tuple]:
    """What the organisation holds in a replay, each with its deadline, as
    ``admission.DatabaseQueue.deadlines`` reads them."""
    return [
        (now + dt.timedelta(seconds=held.deadline), held.workspace_id, held.requested)
        for _, _, held in releases
        if not held.foreign and math.isfinite(held.deadline)
    ]


def _running(organization_id: int, on_host: set[int]) -> list[tuple]:
    """The active reservations that can make room: the organisation's, and, when it launches
    on the shared local host, every organisation's there."""
    which = Q(organization_id=organization_id)
    if on_host:
        which |= Q(host=HOST)
    return list(
        quota_selectors.active_reservations()
        .filter(which)
        .annotate(
            max_runtime=Cast(KeyTextTransform("max_runtime_seconds", "job__spec"), IntegerField()),
            template_id=F("job__template_version__template_id"),
        )
        .values_list(
            "organization_id",
            "workspace_id",
            "created_at",
            "max_runtime",
            "template_id",
            "gpu_flavor",
            *RESOURCES,
        )
    )


def _recent_submissions(organization_id: int, now: dt.datetime) -> list[tuple]:
    """The organisation's most recent submissions (at most :data:`ARRIVAL_SAMPLE`, within
    :data:`ARRIVAL_WINDOW` seconds of ``now``), newest first, as :func:`_arrivals` reads them,
    each with when the organisation was created."""
    since = now - dt.timedelta(seconds=ARRIVAL_WINDOW)
    return list(
        Job.objects.filter(
            organization_id=organization_id, created_at__gt=since, created_at__lte=now
        )
        .annotate(
            template_id=F("template_version__template_id"),
            scanned_max_runtime=Cast(KT("spec__max_runtime_seconds"), IntegerField()),
            scanned_gpu_flavor=KeyTransform("gpu_flavor", "spec"),
        )
        .order_by("-created_at")
        .values_list(
            "created_at",
            "workspace_id",
            "priority",
            *(f"requested_{name}" for name in RESOURCES),
            "scanned_max_runtime",
            "template_id",
            "scanned_gpu_flavor",
            "organization__created_at",
        )[:ARRIVAL_SAMPLE]
    )


@dataclasses.dataclass(frozen=True)
class Arrivals:
    """Each workspace's future submissions as the replay sees them: one every ``every[ws]``
    seconds (its mean rate over the recent window), the k-th a copy of its k-th most recent
    submission (cycling), so the sizes, templates and priorities are the ones it submits."""

    every: dict[int, float]
    jobs: dict[int, list[Queued]]

    def start(self) -> list[tuple[float, int, int]]:
        """The heap of each workspace's next arrival: (seconds from now, workspace, k)."""
        heap = [(every, ws, 0) for ws, every in self.every.items()]
        heapq.heapify(heap)
        return heap


def _arrivals(rows: list[tuple], organization_id: int, now: dt.datetime) -> Arrivals:
    """Future submissions, from the recent ones: a workspace that submitted n jobs in the
    window submits one every window ÷ n seconds from now on (a Poisson process's mean rate;
    arrivals come in bursts, but a prediction cannot know when the next one comes). Fewer than
    :data:`MIN_ARRIVALS` submissions: none. The window is :data:`ARRIVAL_WINDOW`, or, when the
    sample is full, the time its oldest submission goes back, or, for an organisation younger
    than the window, its age (it could not submit before it existed: a window longer than its
    life would spread its submissions over time when it sent none). Its age is at least that
    of its oldest submission (rows imported with their own times)."""
    if len(rows) < MIN_ARRIVALS:
        return Arrivals({}, {})
    born = min(rows[0][-1], rows[-1][0])
    span = min(ARRIVAL_WINDOW, (now - born).total_seconds())
    if len(rows) >= ARRIVAL_SAMPLE:
        span = (now - rows[-1][0]).total_seconds()
    span = max(1.0, span)
    jobs: dict[int, list[Queued]] = defaultdict(list)
    for _, ws_id, priority, *amounts, max_runtime, template_id, flavors, _ in rows:
        jobs[ws_id].append(
            Queued(
                0,
                ws_id,
                organization_id,
                priority,
                now,
                dict(zip(RESOURCES, amounts, strict=True)),
                max_runtime or 0,
                template_id,
                gpu_flavors=tuple(flavors or ()),
            )
        )
    return Arrivals({ws: span / len(submitted) for ws, submitted in jobs.items()}, dict(jobs))


# --- the replay ----------------------------------------------------------------------------


def _base_order(job: Queued) -> tuple:
    return (-job.priority, job.queued_at, job.pk)


class _Future:
    """The submissions still to come during one replay, made as the clock reaches them.

    From ``strict_in`` seconds on, the predicted job, should it not fit, lets no later job go
    first (``admission.overtaking_ends``: at once under fifo): a submission that would queue
    behind it can no longer start before it, so from then on only those that would queue ahead
    of it (a higher priority) are made and count against :data:`MAX_ARRIVALS`. Without this,
    hours of submissions of its priority or lower used up the bound before the higher-priority
    ones that overtake it. The others keep their place in their workspace's turn (the k-th
    arrival is still a copy of its k-th most recent submission): a workspace's most recent
    submissions say most about what it sends next."""

    def __init__(
        self,
        arrivals: Arrivals,
        history: History,
        now: dt.datetime,
        *,
        subject: Queued,
        strict_in: float,
    ):
        self.arrivals, self.history, self.now = arrivals, history, now
        self.heap = arrivals.start()
        self.made = self.passed_over = 0
        self.runtimes: dict[int, Runtime] = {}
        self.strict_in, self.priority = strict_in, subject.priority
        # The workspaces that submit anything that would queue ahead of the subject.
        self.ahead = {
            ws
            for ws, models in arrivals.jobs.items()
            if any(model.priority > subject.priority for model in models)
        }

    def due(self, clock: float) -> Iterator[Queued]:
        """The jobs submitted up to ``clock`` seconds from now (at most :data:`MAX_ARRIVALS`
        in all, and none once :data:`MAX_PASSED_OVER` were passed over), as queued jobs of
        their own."""
        while (
            self.heap
            and self.heap[0][0] <= clock
            and self.made < MAX_ARRIVALS
            and self.passed_over < MAX_PASSED_OVER
        ):
            at, ws_id, k = heapq.heappop(self.heap)
            strict = at >= self.strict_in
            if strict and ws_id not in self.ahead:
                continue  # nothing it submits can start before the job any more
            heapq.heappush(self.heap, (at + self.arrivals.every[ws_id], ws_id, k + 1))
            like = self.arrivals.jobs[ws_id]
            model = like[k % len(like)]
            if strict and model.priority <= self.priority:
                self.passed_over += 1
                continue  # it would queue behind the job
            self.made += 1
            job = dataclasses.replace(
                model, pk=VIRTUAL_PK + self.made, queued_at=self.now + dt.timedelta(seconds=at)
            )
            self.runtimes[id(job)] = _runtime(
                self.history.of(job.template_id, ws_id), job.max_runtime_seconds
            )
            yield job


def _replay(
    ledger,
    job: Queued,
    queue: list[Queued],
    running: list[Running],
    runtimes: dict[int, Runtime],
    quantile: int,
    now: dt.datetime,
    future: _Future,
    in_a_row: int,
    watch: Watch = NOBODY,
) -> tuple[float | None, int, int]:
    """Seconds from now until ``job`` is admitted (None: never), how many queued jobs are
    admitted before it and how many expected submissions, replaying admission with the
    ``quantile`` (0: p50, 1: p90) run times and the ``future`` submissions (``in_a_row``:
    :func:`_typical`). ``watch`` follows the job through the first pass, the one a worker
    would run now. ``ledger`` is changed: pass a copy."""
    policy, max_wait = admission.policy_of(ledger)
    # fair_share weighs past usage, which grows as jobs end (quotas.services folds each
    # released hold in): the replay does the same, or a workspace's key would stay as it is
    # now however much the replay lets it run.
    accrues = policy == QueuePolicy.FAIR_SHARE
    order = itertools.count()
    releases = [(held.ends[quantile], next(order), held) for held in running]
    heapq.heapify(releases)
    remaining, clock, ahead, overtakers = list(queue), 0.0, 0, 0
    while True:
        at = now + dt.timedelta(seconds=clock)
        admitted = admission.plan(
            ledger,
            job.organization_id,
            policy,
            max_wait,
            queue=SimulatedQueue(remaining, lambda: _deadlines(releases, now)),
            now=at,
            watch=watch,
        )
        watch = NOBODY
        for admitted_job in admitted:
            if admitted_job is job:
                return clock, ahead, overtakers
            future_job = admitted_job.pk >= VIRTUAL_PK  # it has no place in the queue yet
            ahead += not future_job
            overtakers += future_job
            runtime = runtimes.get(id(admitted_job)) or future.runtimes[id(admitted_job)]
            flavor = ledger.flavors.flavor_of(admitted_job) if ledger.flavors else ""
            hold = Running(
                admitted_job.workspace_id,
                admitted_job.requested,
                False,
                (0, 0),
                flavor,
                clock,
                clock + admitted_job.max_runtime_seconds,
            )
            if quantile:
                end = clock + runtime.p90
            else:
                end = clock + _typical(runtime, clock >= future.strict_in, in_a_row)
            heapq.heappush(releases, (end, next(order), hold))
        if admitted:
            gone = {id(admitted_job) for admitted_job in admitted}
            remaining = [queued for queued in remaining if id(queued) not in gone]
        if not releases:
            return None, ahead, overtakers  # nothing left to release, and it still does not fit
        clock = releases[0][0]
        while releases and releases[0][0] <= clock:
            _, _, held = heapq.heappop(releases)
            if held.foreign:
                ledger.host.add(held.requested, -1)
                continue
            ledger.hold(held, -1)
            if accrues:
                at = now + dt.timedelta(seconds=clock)
                ledger.accrue(held.workspace_id, held.requested, clock - held.since, at)
        # What was submitted meanwhile joins the queue in its place: the next pass weighs it
        # (a pass runs when room is made; an arrival in a full organisation waits for one).
        for arrived in future.due(clock):
            bisect.insort(remaining, arrived, key=_base_order)


def _typical(runtime: Runtime, strict: bool, in_a_row: int) -> float:
    """The hold the p50 replay gives a job admitted while the predicted job lets later jobs go
    first (``strict`` False) or not. Overtakable, it starts at the first end that makes room
    for it, a race, which each hold's median stands for (the running jobs' ends are spread as
    a race, :func:`_release_times`). In strict order it starts once every job ahead of it has
    started: where ``in_a_row`` holds follow one another on each place, its wait adds them up,
    and the median of a sum of skewed holds lies above the sum of their medians, near the sum
    of their means for a long one (with medians, three fifo waits in four on the synthetic
    trace were predicted early; docs/prediction.md): :func:`_hold_in_a_sum`."""
    if not strict or in_a_row == 1 or not runtime.runs:
        return runtime.p50
    return _hold_in_a_sum(tuple(_thinned(runtime.runs)), in_a_row)


def cached_prediction(job: Job) -> Prediction:
    """:func:`predict_start` for a job's detail, kept ``MANTA_PREDICTION_CACHE_SECONDS`` in the
    shared cache: a replay deep in a round-robin queue costs seconds, and a client polling the
    job would pay it on every read. The key names the job's state and queue time, so a job that
    moves is predicted afresh."""
    key = f"prediction:{job.pk}:{job.state}:{job.queued_at and job.queued_at.timestamp()}"
    try:
        prediction = cache.get(key)
    except (RedisError, OSError):
        # A cache outage costs a replay per read, never the read itself (a job's detail is
        # the answer to its submission).
        logger.warning("prediction cache unavailable, predicting afresh", exc_info=True)
        return predict_start(job)
    if prediction is None:
        prediction = predict_start(job)
        try:
            cache.set(key, prediction, timeout=settings.MANTA_PREDICTION_CACHE_SECONDS)
        except (RedisError, OSError):
            logger.warning("prediction cache unavailable, not kept", exc_info=True)
    return prediction


def predict_start(job: Job, *, now: dt.datetime | None = None) -> Prediction:
    """When ``job`` (queued, pending approval, or an unsaved job a dry run built) is expected
    to be admitted: its place in the admission order, what blocks it now, and its p50/p90
    start. Reads a fixed number of queries, whatever the length of the queue."""
    now = now or timezone.now()
    on_host = workspaces_on_host(job.organization_id)
    ledger = admission.ledger_for(job.organization_id, on_host)
    pending = job.state == JobState.PENDING_APPROVAL
    blocker = "approval" if pending else reason_of(ledger, job)
    queue, subject = _queue(job, now)
    if subject is None:
        far = f"more than {MAX_AHEAD} queued jobs come before it"
        return Prediction(
            _ahead(job) + 1,
            blocker,
            None,
            None,
            f"{far}: too far back to predict",
            waiting_for=_waiting_for(job, ledger, pending) or far,
        )
    rows = _running(job.organization_id, on_host)
    recent = _recent_submissions(job.organization_id, now)
    arrivals = _arrivals(recent, job.organization_id, now)
    history = template_runtimes(
        [row[4] for row in rows]
        + [queued.template_id for queued in queue]
        + [model.template_id for models in arrivals.jobs.values() for model in models]
    )
    rests, elapsed = [], []
    deadlines = []
    for _, ws_id, created, max_runtime, template_id, *_ in rows:
        elapsed.append((now - created).total_seconds())
        deadlines.append((max_runtime or 0) - elapsed[-1])
        runtime = _runtime(history.of(template_id, ws_id), max_runtime)
        rests.append(_remaining(runtime, elapsed[-1]))
    running = [
        Running(
            ws_id,
            dict(zip(RESOURCES, amounts, strict=True)),
            org_id != job.organization_id,
            ends,
            flavor,
            -held,
            deadline,
        )
        for (org_id, ws_id, _, _, _, flavor, *amounts), ends, held, deadline in zip(
            rows, _release_times(rests), elapsed, deadlines, strict=True
        )
    ]
    runtimes = {
        id(queued): _runtime(
            history.of(queued.template_id, queued.workspace_id), queued.max_runtime_seconds
        )
        for queued in queue
    }
    strict_in = admission.overtaking_ends(subject, *admission.policy_of(ledger), now)
    in_a_row = _holds_in_a_row(queue.index(subject), len(running))
    starts = []
    watch = Watch(subject.pk, subject.workspace_id)
    for quantile in (0, 1):
        future = _Future(arrivals, history, now, subject=subject, strict_in=strict_in)
        wait, ahead, overtakers = _replay(
            copy.deepcopy(ledger),
            subject,
            queue,
            running,
            runtimes,
            quantile,
            now,
            future,
            in_a_row,
            watch=NOBODY if quantile else watch,
        )
        starts.append((wait, ahead, overtakers))
    (wait50, ahead, overtakers), (wait90, _, _) = starts
    waiting_for = _waiting_for(job, ledger, pending) or watch.reason
    if blocker == "admission_pass" and watch.kind:
        blocker = watch.kind  # what of the queue keeps it, when it fits on its own
    if wait50 is None:
        reason = "it does not fit even when every running and earlier job has ended"
        return Prediction(ahead + 1, blocker, None, None, reason, waiting_for=waiting_for)
    if wait50 == 0 and not pending:
        return Prediction(0, None, now, now)
    p90 = max(wait50, wait90 if wait90 is not None else wait50)
    return Prediction(
        ahead + 1,
        blocker,
        now + dt.timedelta(seconds=wait50),
        now + dt.timedelta(seconds=p90),
        overtakers=overtakers,
        waiting_for=waiting_for or NEXT_PASS,
    )


def _waiting_for(job: Job, ledger, pending: bool) -> str:
    """What keeps ``job`` out on its own, in words ('' when nothing does): its approval, or
    what the ledger says (the rest of the queue is the replay's first pass to say)."""
    if pending:
        return f"approval: {job.approval_reason}"
    return ledger.blocker(job)


def _ahead(job: Job) -> int:
    """How many queued jobs come before ``job`` in base order (one count)."""
    queued = admission._queued(job.organization_id)
    if job.pk is None or job.state != JobState.QUEUED:
        return queued.filter(priority__gte=job.priority).count()
    return queued.filter(
        Q(priority__gt=job.priority)
        | Q(priority=job.priority, queued_at__lt=job.queued_at)
        | Q(priority=job.priority, queued_at=job.queued_at, id__lt=job.pk)
    ).count()


@dataclasses.dataclass(frozen=True)
class DryRun:
    """What a submission would do now, without creating anything."""

    job: Job  # unsaved: what job_prepare built
    prediction: Prediction

    @property
    def would_admit_now(self) -> bool:
        return self.job.state == JobState.QUEUED and self.prediction.position == 0


def dry_run(job: Job, *, now: dt.datetime | None = None) -> DryRun:
    """The answer to ``POST …/jobs/?dry_run=true`` for the unsaved ``job``."""
    return DryRun(job, predict_start(job, now=now))
