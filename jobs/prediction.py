"""When will a queued job start: a replay of the organisation's queue on a copy of its ledger.

:func:`predict_start` reads what the organisation holds (``admission.ledger_for``), its running
jobs and its queue, then plays admission forward on a simulated clock: each running job releases
its reservation at its expected end, and at each release the organisation's policy
(``admission.plan``, the function the workers call, over an in-memory queue) admits what fits,
until the job is admitted. The expected run time of a job is the recent history of its template
(how long its succeeded attempts held their reservation, admission to end), capped by its
``max_runtime_seconds``; p50 replays with the medians, p90 with the 90th percentiles.

Bounded: it reads a fixed number of queries whatever the queue's length, and simulates at most
:data:`MAX_AHEAD` queued jobs. See docs/prediction.md for what it does not model.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import heapq
import itertools
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.core.cache import cache
from django.db.models import F, IntegerField, Q, Window
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, RowNumber
from django.utils import timezone
from redis.exceptions import RedisError

from quotas import selectors as quota_selectors
from quotas.models import RESOURCES, QueuePolicy

from . import admission
from .local_host import HOST, workspaces_on_host
from .metrics_snapshot import reason_of
from .models import AttemptState, Job, JobAttempt, JobState

logger = logging.getLogger(__name__)
MAX_AHEAD = 500  # queued jobs simulated; a job further back in the queue gets no prediction
HISTORY_RUNS = 50  # a template's most recent succeeded attempts that make its run-time history
FALLBACK_RUNTIME = 3600  # seconds, for a job with neither history nor max_runtime_seconds
VIRTUAL_PK = 2**62  # the place in the queue of a job not yet submitted: after every other


@dataclasses.dataclass(frozen=True)
class Prediction:
    position: int  # 1-based place in the org's admission order (0 = would be admitted now)
    blocker: str | None  # a reason from the why-waiting set, None if it would be admitted now
    p50: dt.datetime | None  # predicted start, median; None = cannot predict (never fits)
    p90: dt.datetime | None
    why_unknown: str = ""  # when p50 is None: why


@dataclasses.dataclass(frozen=True)
class Runtime:
    """How long a job is expected to hold its reservation, in seconds."""

    p50: float
    p90: float
    cap: float  # its max_runtime_seconds: Manta ends it there


@dataclasses.dataclass(frozen=True)
class Running:
    """An active reservation, and when it is expected to be released (seconds from now)."""

    workspace_id: int
    requested: dict[str, float]
    foreign: bool  # another organisation's, on the shared local host: only the host's count
    ends: tuple[float, float]  # (p50, p90)
    gpu_flavor: str = ""  # the GPU flavor it holds


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

    def __init__(self, queued: list[Queued]):
        self.queued = queued

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


def template_runtimes(template_ids: Iterable[int]) -> dict[int, tuple[float, float]]:
    """(median, p90) seconds that each template's recent succeeded attempts held their
    reservation (admission to end): one query for all the templates."""
    ids = {pk for pk in template_ids if pk is not None}
    if not ids:
        return {}
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
        .values_list("template_id", "created_at", "finished_at")
    )
    durations: dict[int, list[float]] = defaultdict(list)
    for template_id, created, finished in rows:
        durations[template_id].append(max(0.0, (finished - created).total_seconds()))
    return {pk: (_quantile(d, 0.5), _quantile(d, 0.9)) for pk, d in durations.items()}


def _runtime(history: tuple[float, float] | None, max_runtime: int | None) -> Runtime:
    """A job's expected hold: its template's history capped by its max runtime; with no
    history, the max runtime itself (the pessimistic answer: no job holds longer)."""
    cap = float(max_runtime or FALLBACK_RUNTIME)
    if history is None:
        return Runtime(cap, cap, cap)
    return Runtime(min(history[0], cap), min(history[1], cap), cap)


def _remaining(runtime: Runtime, elapsed: float) -> tuple[float, float]:
    """Seconds until a job that has held its reservation for ``elapsed`` releases it, at p50
    and p90: a job past its median is expected at its p90, past that at its deadline."""
    ends = []
    for expected in (runtime.p50, runtime.p90):
        later = [end for end in (expected, runtime.p90, runtime.cap) if end > elapsed]
        ends.append(min(later) - elapsed if later else 0.0)
    return ends[0], ends[1]


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


# --- the replay ----------------------------------------------------------------------------


def _replay(
    ledger,
    job: Queued,
    queue: list[Queued],
    running: list[Running],
    runtimes: dict[int, Runtime],
    quantile: int,
    now: dt.datetime,
) -> tuple[float | None, int]:
    """Seconds from now until ``job`` is admitted (None: never), and how many queued jobs are
    admitted before it, replaying admission with the ``quantile`` (0: p50, 1: p90) run times.
    ``ledger`` is changed: pass a copy."""
    quota = ledger.org_quota
    policy = quota.policy if quota else QueuePolicy.FIFO
    max_wait = quota.balanced_max_wait_seconds if quota else 600
    order = itertools.count()
    releases = [(held.ends[quantile], next(order), held) for held in running]
    heapq.heapify(releases)
    remaining, clock, ahead = queue, 0.0, 0
    while True:
        at = now + dt.timedelta(seconds=clock)
        admitted = admission.plan(
            ledger,
            job.organization_id,
            policy,
            max_wait,
            queue=SimulatedQueue(remaining),
            now=at,
        )
        for admitted_job in admitted:
            if admitted_job is job:
                return clock, ahead
            ahead += 1
            runtime = runtimes[id(admitted_job)]
            flavor = ledger.flavors.flavor_of(admitted_job) if ledger.flavors else ""
            hold = Running(admitted_job.workspace_id, admitted_job.requested, False, (0, 0), flavor)
            end = clock + (runtime.p50, runtime.p90)[quantile]
            heapq.heappush(releases, (end, next(order), hold))
        if admitted:
            gone = {id(admitted_job) for admitted_job in admitted}
            remaining = [queued for queued in remaining if id(queued) not in gone]
        if not releases:
            return None, ahead  # nothing left to release, and it still does not fit
        clock = releases[0][0]
        while releases and releases[0][0] <= clock:
            _, _, held = heapq.heappop(releases)
            if held.foreign:
                ledger.host.add(held.requested, -1)
            else:
                ledger.hold(held, -1)


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
        return Prediction(
            _ahead(job) + 1,
            blocker,
            None,
            None,
            f"more than {MAX_AHEAD} queued jobs come before it: too far back to predict",
        )
    rows = _running(job.organization_id, on_host)
    history = template_runtimes([row[4] for row in rows] + [queued.template_id for queued in queue])
    running = []
    for org_id, ws_id, created, max_runtime, template_id, flavor, *amounts in rows:
        elapsed = (now - created).total_seconds()
        runtime = _runtime(history.get(template_id), max_runtime)
        running.append(
            Running(
                ws_id,
                dict(zip(RESOURCES, amounts, strict=True)),
                org_id != job.organization_id,
                _remaining(runtime, elapsed),
                flavor,
            )
        )
    runtimes = {
        id(queued): _runtime(history.get(queued.template_id), queued.max_runtime_seconds)
        for queued in queue
    }
    starts = []
    for quantile in (0, 1):
        wait, ahead = _replay(
            copy.deepcopy(ledger), subject, queue, running, runtimes, quantile, now
        )
        starts.append((wait, ahead))
    (wait50, ahead), (wait90, _) = starts
    if wait50 is None:
        reason = "it does not fit even when every running and earlier job has ended"
        return Prediction(ahead + 1, blocker, None, None, reason)
    if wait50 == 0 and not pending:
        return Prediction(0, None, now, now)
    p90 = max(wait50, wait90 if wait90 is not None else wait50)
    return Prediction(
        ahead + 1, blocker, now + dt.timedelta(seconds=wait50), now + dt.timedelta(seconds=p90)
    )


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
