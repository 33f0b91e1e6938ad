"""Admission: which queued jobs may launch now, under the org's capacity and each workspace's
limits, in the order the org's policy says — and why the others wait.

One admission pass per organisation is one transaction, serialised by a PostgreSQL advisory lock
(SQLite's IMMEDIATE transactions serialise it there), so any number of workers may run it at once:
each pass reads the reservations that are held (``quotas.selectors.ledger_for``), admits what
fits (the arithmetic is ``quotas/ledger.py``), and writes the new reservations in the same
transaction that moves the jobs to ``launching``. Leaving ``launching``/``running``/
``preempting`` releases them: ``jobs.state.transition`` does that in the same transaction as
the move. Where the organisation allows it, a pass also preempts borrowers for workspaces under
their guarantee (``jobs/preemption.py``); a preemptor whose victims have a grace period waits
for them to leave, with the room promised to it.

What refuses a job at submission is ``jobs/submission.py``.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import heapq
import math
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, IntegerField, OuterRef, Q
from django.db.models.fields.json import KT, KeyTextTransform, KeyTransform
from django.db.models.functions import Cast
from django.utils import timezone

from quotas import selectors as quota_selectors
from quotas import services as quota_services
from quotas.ledger import Ledger, month_start
from quotas.models import RESOURCES, AdmissionRequests, QueuePolicy
from quotas.tree import ROOT
from workspaces.models import Organization, Workspace

from . import dispatch
from .accounting import gpu_hours, gpu_hours_by_flavor
from .attempts import attempts_create, attempts_preempt
from .backfill import Backfill, Deadline, HeldBack
from .fair_tree import plan_fair_tree
from .gpu_pools import gpu_pools
from .local_host import HOST, workspaces_on_host
from .local_host import capacity as host_capacity
from .models import Job, JobState
from .pools import pools_yield
from .preemption import plan_preemptions, promised_jobs
from .waiting import NEXT_PASS, NOBODY, Decided, Watch, in_this_pass

ADVISORY_NAMESPACE = 0x6D61  # "ma": keeps our lock ids apart from other users of pg locks
HOST_LOCK = -1  # passes that may place jobs on the shared local host take it after their org's
QUEUE_CHUNK = 500  # queued rows fetched at a time: a pass reads only as far as it admits
MAX_BLOCKED_SCAN = 1000  # round_robin/balanced/intelligent: stop after this many misses in a row
# intelligent: jobs of this priority and above keep strict order (PAI-DLC's "intelligent").
STRICT_PRIORITY = 7

# What a pass reads of a queued job: the rest of the row (its spec, timestamps, texts) is
# loaded by the transition that admits it, so the scan stays cheap however long the queue.
PLAN_FIELDS = (
    "id",
    "organization_id",
    "workspace_id",
    "priority",
    "queued_at",
    "state",
    "requested_cpu",
    "requested_memory_gb",
    "requested_gpu",
    "requested_disk_gb",
)


def ledger_for(organization_id: int, on_host: set[int] | None = None) -> Ledger:
    """What the organisation holds, against its limits and those of this host (``on_host``:
    its workspaces that launch here, when the caller has them already)."""
    period = month_start(timezone.now())
    return quota_selectors.ledger_for(
        organization_id,
        on_host=workspaces_on_host(organization_id) if on_host is None else on_host,
        host=HOST,
        host_capacity=host_capacity,
        gpu_hours_used=lambda quota: gpu_hours(quota.workspace, period),
        gpu_pools=lambda: gpu_pools(organization_id, on_host),
        flavor_hours_used=lambda quota: gpu_hours_by_flavor(quota.workspace, period),
    )


def policy_of(ledger: Ledger) -> tuple[str, float]:
    """The organisation's queue policy and its ``balanced_max_wait_seconds``."""
    quota = ledger.org_quota
    if quota is None:
        return QueuePolicy.FIFO, 600
    return quota.policy, quota.balanced_max_wait_seconds


# --- the queue -----------------------------------------------------------------------------


def _scan(queryset):
    return queryset.only(*PLAN_FIELDS).annotate(
        scanned_max_runtime=Cast(KT("spec__max_runtime_seconds"), IntegerField()),
        scanned_gpu_flavor=KeyTransform("gpu_flavor", "spec"),
    )


def _queued(organization_id: int):
    """Queued jobs in base order: priority (9 first), then time queued, then id."""
    return Job.objects.filter(organization_id=organization_id, state=JobState.QUEUED).order_by(
        "-priority", "queued_at", "id"
    )


class DatabaseQueue:
    """The queue an admission pass reads: the organisation's queued jobs, in base order, read
    lazily from the database, but for ``exclude`` (jobs the pass has dealt with already). A
    prediction (``jobs/prediction.py``) hands :func:`plan` a queue of its own, held in memory,
    with the same two methods."""

    def __init__(self, organization_id: int, exclude: Iterable[int] = ()):
        self.organization_id = organization_id
        self.exclude = set(exclude)

    def jobs(self, workspace_id: int | None = None) -> Iterator[Job]:
        """Queued jobs (of one workspace, when given) in base order."""
        queued = _queued(self.organization_id).exclude(pk__in=self.exclude)
        if workspace_id is None:
            return _scan(queued).iterator(chunk_size=QUEUE_CHUNK)
        return _scan(queued.filter(workspace_id=workspace_id)).iterator(chunk_size=64)

    def deadlines(self) -> list[Deadline]:
        """What the organisation holds, each reservation with its deadline: when it was
        admitted plus its job's ``max_runtime_seconds`` (Manta ends the job by then, launch
        aside). One read, made only by a pass that backfills around an overdue head."""
        max_runtime = Cast(KeyTextTransform("max_runtime_seconds", "job__spec"), IntegerField())
        rows = (
            quota_selectors.active_reservations()
            .filter(organization_id=self.organization_id)
            .annotate(max_runtime=max_runtime)
            .values_list("created_at", "max_runtime", "workspace_id", *RESOURCES)
        )
        return [
            (
                at + dt.timedelta(seconds=seconds or 0),
                workspace_id,
                dict(zip(RESOURCES, amounts, strict=True)),
            )
            for at, seconds, workspace_id, *amounts in rows
        ]

    def workspace_ids(self) -> Iterable[int]:
        """The workspaces with queued jobs: for each of the organisation's workspaces, whether
        its queue has a first job (an index probe each), not a DISTINCT over the whole queue,
        whose cost grew with it (32 ms a pass at 100,000 queued). The cost now follows how many
        workspaces the organisation has, not how much they queue."""
        waiting = Job.objects.filter(workspace_id=OuterRef("pk"), state=JobState.QUEUED)
        return (
            Workspace.objects.filter(organization_id=self.organization_id)
            .filter(Exists(waiting.exclude(pk__in=self.exclude)))
            .order_by()
            .values_list("pk", flat=True)
        )


def plan(
    ledger: Ledger,
    organization_id: int,
    policy: str,
    max_wait: float,
    *,
    queue: DatabaseQueue | None = None,
    now: dt.datetime | None = None,
    watch: Watch = NOBODY,
) -> list[Job]:
    """The jobs to admit now, in admission order (``ledger`` is updated as they are held).

    The queue is read lazily, in chunks, so a pass costs what it admits, not what is queued.
    ``queue`` and ``now`` default to the database's queue and the present; a prediction passes
    a simulated queue and clock, and ``explain`` a ``watch`` on the job it explains
    (``jobs/waiting.py``).
    """
    queue = queue or DatabaseQueue(organization_id)
    now = now or timezone.now()
    if policy == QueuePolicy.FAIR_SHARE:
        return _plan_fair_share(ledger, queue, now, max_wait, watch)
    admitted: list[Job] = []
    misses = 0
    for job in queue.jobs():
        if blocker := ledger.blocker(job):
            watch.passed(job, "admission_pass", in_this_pass, blocker, admitted)
            if not _may_be_overtaken(job, policy, max_wait, now):
                watch.stopped(job, _strict_head, job, blocker, policy, max_wait)
                break
            misses += 1
            if misses >= MAX_BLOCKED_SCAN:
                watch.stopped(job, _scan_ends)
                break
            continue
        misses = 0
        ledger.hold(job)
        admitted.append(job)
        watch.admitted(job)
    return admitted


def _scan_ends() -> str:
    return (
        f"a pass stops looking after {MAX_BLOCKED_SCAN} jobs in a row that do not fit, and "
        "they all come before it in the queue"
    )


def _strict_head(job: Job, blocker: str, policy: str, max_wait: float) -> str:
    """Why no later job of the queue goes before ``job``, which does not fit."""
    if policy == QueuePolicy.FIFO:
        rule = "under fifo no job starts before an earlier one"
    elif policy == QueuePolicy.BALANCED:
        rule = (
            f"it has waited more than balanced_max_wait_seconds ({max_wait:g}), so later jobs "
            "no longer go first"
        )
    elif job.priority >= STRICT_PRIORITY:
        rule = f"under intelligent its priority {job.priority} keeps strict order"
    else:
        rule = (
            f"it has waited more than MANTA_INTELLIGENT_AGING_MINUTES "
            f"({settings.MANTA_INTELLIGENT_AGING_MINUTES:g}), so later jobs no longer go first"
        )
    return f"behind job {job.pk}, which comes before it and waits ({blocker}): {rule}"


def _overtakable_for(job: Job, policy: str, max_wait: float) -> float:
    """How long (seconds of waiting) a queued job that does not fit lets later jobs of the
    queue go before it.

    fifo: never. round_robin: always. balanced: until it waited ``max_wait`` seconds.
    intelligent: a job of priority 7-9 never (strict order from the top of the queue down); one
    of priority 1-6 until it waited ``MANTA_INTELLIGENT_AGING_MINUTES``. fair_share: always
    (its order is the workspaces' shares, not the queue's).
    """
    if policy == QueuePolicy.FIFO:
        return -math.inf
    if policy == QueuePolicy.INTELLIGENT:
        return -math.inf if job.priority >= STRICT_PRIORITY else aging_seconds()
    if policy == QueuePolicy.BALANCED:
        return max_wait
    return math.inf


def _may_be_overtaken(job: Job, policy: str, max_wait: float, now: dt.datetime) -> bool:
    """Whether a queued job that does not fit lets later jobs of the queue go before it now
    (:func:`_overtakable_for`)."""
    return _waited(job, now) <= _overtakable_for(job, policy, max_wait)


def overtaking_ends(job: Job, policy: str, max_wait: float, now: dt.datetime) -> float:
    """Seconds from ``now`` until ``job``, while it does not fit, stops every later job of the
    queue from going first (:func:`_overtakable_for`): 0 when it already does, infinite when
    it never will."""
    return max(0.0, _overtakable_for(job, policy, max_wait) - _waited(job, now))


def aging_seconds() -> float:
    return settings.MANTA_INTELLIGENT_AGING_MINUTES * 60


def _waited(job: Job, now: dt.datetime) -> float:
    return (now - (job.queued_at or now)).total_seconds()


def _fair_key(ledger: Ledger, ws_id: int, job: Job, now: dt.datetime) -> tuple:
    return (ledger.fair_share_key(ws_id, now), -job.priority, job.queued_at, job.pk, ws_id, job)


def _plan_fair_share(
    ledger: Ledger, queue: DatabaseQueue, now: dt.datetime, max_wait: float, watch: Watch = NOBODY
) -> list[Job]:
    """Next job from the workspace with the lowest fair-share key (``Ledger.fair_share_key``:
    its share now plus its decayed past usage, over its weight), until no workspace's head
    fits; each workspace's queue is read on demand. Under quota groups: the Fair Tree of
    ``jobs/fair_tree.py``, with the same holding back.

    A head that does not fit lets the others go first, until it has waited ``max_wait``
    seconds (the org's ``balanced_max_wait_seconds``): from then on, if its workspace is owed
    it (:func:`_owed`), it holds back the resources the organisation is short of for it, and no
    job that needs them starts before it. Without that, a workspace's 4-GPU job within its
    guarantee would wait for ever behind a stream of 1-GPU jobs of workspaces that borrow
    (Slurm's backfill reservation, without run-time estimates). A job beyond its workspace's
    guarantee holds nothing back outright: capacity would idle for a job nobody owes. The first
    such head instead gets a reservation in time (``jobs/backfill.py``): later jobs that would
    delay it past when the running jobs' deadlines make room for it wait."""

    def overdue(job: Job) -> bool:
        return _waited(job, now) > max_wait

    if ledger.groups:
        return plan_fair_tree(
            ledger,
            queue,
            now,
            overdue=lambda job: overdue(job) and _owed(ledger, job),
            backfill=Backfill(ledger, now, overdue, queue.deadlines),
            watch=watch,
        )
    queues = {ws: queue.jobs(ws) for ws in queue.workspace_ids()}
    # A heap of each workspace's head, keyed by its workspace's fair-share key: only the
    # workspace that just got a job changes its share (its past usage is fixed for the pass),
    # so the heap stays valid.
    heap = []
    for ws, jobs in queues.items():
        head = next(jobs, None)
        if head is not None:
            heapq.heappush(heap, _fair_key(ledger, ws, head, now))
    admitted: list[Job] = []
    held_back = HeldBack(ledger)
    backfill = Backfill(ledger, now, overdue, queue.deadlines)
    while heap:
        *_, ws_id, job = heapq.heappop(heap)
        category = "held_back"
        if why := held_back.keeps(job):
            pass  # it needs what a job ahead of it has waited too long for
        elif blocker := ledger.blocker(job):
            if overdue(job) and _owed(ledger, job):
                held_back.hold_for(job, [(ROOT, name) for name in ledger.short_of(job)])
            else:
                backfill.blocked(job, admitted)
            category, why = "admission_pass", (in_this_pass, blocker, admitted)
        elif why := held_back.keeps_flavor(job):
            pass  # it would take a GPU of the flavor an overdue job waits for
        elif not backfill.lets(job):
            # It would delay an overdue head beyond its guarantee past its shadow time.
            why = (backfill.why, job)
        else:
            ledger.hold(job)
            admitted.append(job)
            watch.admitted(job)
            following = next(queues[ws_id], None)
            if following is not None:
                heapq.heappush(heap, _fair_key(ledger, ws_id, following, now))
            continue
        # It does not start: its workspace waits for the rest of the pass.
        watch.passed(job, category, *why)
        watch.workspace_waits(job, *why)
    return admitted


def _owed(ledger: Ledger, job: Job) -> bool:
    """Whether ``job`` waits only for what others hold and stays within its workspace's
    guarantee: capacity its workspace is owed."""
    return not ledger.workspace_blocker(job) and ledger.within_guarantee(job)


# --- the pass ------------------------------------------------------------------------------


def _lock(key: int, *, wait: bool = True) -> bool:
    """Take the admission lock ``key`` (an organisation, or :data:`HOST_LOCK`) for this
    transaction (SQLite's IMMEDIATE transactions already serialise writers). Without ``wait``,
    False when a pass holds it."""
    if connection.vendor != "postgresql":
        return True
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, %s)", [ADVISORY_NAMESPACE, key])
        return wait or cursor.fetchone()[0]


def lock_admission(organization_id: int) -> None:
    """Hold the organisation's admission lock until the caller's transaction ends: a step that
    frees capacity and admits in one transaction (``jobs/preempting.py``) takes it first, as a
    pass does."""
    _lock(organization_id)


def lock_host() -> None:
    """Hold the local host's admission lock until the caller's transaction ends: a warm pool
    taking room on the host (``jobs/pool_upkeep.py``) takes it, as a pass placing jobs does."""
    _lock(HOST_LOCK)


def admit(organization_id: int, *, first: Iterable[int] = ()) -> list[int]:
    """One admission pass for an organisation, waiting for a pass in progress to finish.
    Returns the admitted job ids. ``first``: queued jobs to admit before the queue's order
    (a preemptor whose victims just left), when they fit."""
    with transaction.atomic():
        _lock(organization_id)
        return _admit_locked(organization_id, first=first)


def _request_pass(organization_id: int, *, within: int | None = None) -> bool:
    """Record (committed at once) that a pass is wanted for the organisation. With ``within``:
    only when it has at most that many queued jobs (counted only as far as the bound, in the
    same statement; outside the lock, so only a bound on the cost: the pass decides what is
    admitted). False, and nothing recorded, for a longer queue."""
    table = AdmissionRequests._meta.db_table
    condition, params = "", [organization_id]
    if within is not None:
        condition = (
            "WHERE (SELECT COUNT(*) FROM (SELECT 1 FROM "
            f"{Job._meta.db_table} WHERE organization_id = %s AND state = %s LIMIT %s) q) <= %s "
        )
        params += [organization_id, JobState.QUEUED, within + 1, within]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (organization_id, requested, served) SELECT %s, 1, 0 "
            f"{condition}ON CONFLICT (organization_id) "
            f"DO UPDATE SET requested = {table}.requested + 1 RETURNING requested",
            params,
        )
        return cursor.fetchone() is not None


def _mark_served(organization_id: int, requested: int) -> None:
    """The requests up to ``requested`` are served (in the pass's transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {AdmissionRequests._meta.db_table} SET served = %s WHERE organization_id = %s",
            [requested, organization_id],
        )


def admit_single_flight(organization_id: int) -> list[int]:
    """What a trigger runs: at most one pass per organisation at a time, and none lost.

    A trigger records its request, then tries the lock. If a pass holds it, the trigger returns
    at once: that pass, once committed, sees a request newer than the one it served and goes
    round again. A request is recorded (committed) before its lock attempt, and a pass looks
    for new requests only after its commit released the lock, so either the trigger gets the
    lock or the pass sees its request.
    """
    if connection.vendor != "postgresql":
        return admit(organization_id)
    requests = AdmissionRequests.objects.filter(organization_id=organization_id)
    _request_pass(organization_id)
    admitted: list[int] = []
    while True:
        with transaction.atomic():
            if not _lock(organization_id, wait=False):
                return admitted  # the pass holding the lock serves this request
            requested = requests.values_list("requested", flat=True).get()
            admitted += _admit_locked(organization_id)
            _mark_served(organization_id, requested)
        if not requests.filter(requested__gt=F("served")).exists():
            return admitted


class _HostBusy(Exception):
    """The shared host's admission lock is held: an inline pass does not wait for it."""


def admit_inline(organization_id: int) -> list[int]:
    """The one-hop trigger: what a request that just queued a job runs after its commit (on
    PostgreSQL), instead of sending the admit task, so the job's launch task is the only hop.

    It is the single-flight pass (same request counter, same lock, same plan), kept small for a
    request: it never waits (a pass in progress serves its request, as for any trigger), runs
    one round at most, and only when the organisation has at most
    ``MANTA_INLINE_ADMISSION_MAX_QUEUED`` queued jobs (its cost stays that of a few jobs,
    whatever the policy) and the shared host's lock is free. Whatever it leaves (a longer
    queue, a busy host, requests that came during its round) it hands to the admit task.
    Returns the admitted job ids."""
    if connection.vendor != "postgresql":  # SQLite: the worker's pass, as before
        dispatch.admit()
        return []
    bound = settings.MANTA_INLINE_ADMISSION_MAX_QUEUED
    if bound == 0 or not _request_pass(organization_id, within=bound):
        dispatch.admit()  # a long queue is the worker's, and nothing was asked
        return []
    requests = AdmissionRequests.objects.filter(organization_id=organization_id)
    admitted: list[int] | None = None
    try:
        with transaction.atomic():
            requested = _try_lock_reading_requests(organization_id)
            if requested is None:
                return []  # the pass holding the lock serves this request
            admitted = _admit_locked(organization_id, wait_for_host=False)
            _mark_served(organization_id, requested)
    except _HostBusy:
        pass  # rolled back, nothing served: the task's pass waits for the host
    if admitted is None or requests.filter(requested__gt=F("served")).exists():
        dispatch.admit()
    return admitted or []


def _try_lock_reading_requests(organization_id: int) -> int | None:
    """Try the organisation's lock and read its request counter, in one statement; None when
    a pass holds the lock. The counter is read in the statement's snapshot, taken just before
    the lock: a request that snapshot misses is not marked served, so the pass goes round again
    for it (never one lost)."""
    table = AdmissionRequests._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT pg_try_advisory_xact_lock(%s, %s), "
            f"(SELECT requested FROM {table} WHERE organization_id = %s)",
            [ADVISORY_NAMESPACE, organization_id, organization_id],
        )
        locked, requested = cursor.fetchone()
    return requested if locked else None


def _admit_locked(
    organization_id: int, *, first: Iterable[int] = (), wait_for_host: bool = True
) -> list[int]:
    on_host = workspaces_on_host(organization_id)
    # The local host is shared by every organisation: one pass at a time reserves on it.
    if on_host and not _lock(HOST_LOCK, wait=wait_for_host):
        raise _HostBusy
    ledger = ledger_for(organization_id, on_host)
    quota = ledger.org_quota
    policy, max_wait = policy_of(ledger)
    done = _hold_promised(ledger, organization_id)
    chosen: list[Job] = []
    if first := set(first) - done.keys():
        for job in _scan(_queued(organization_id).filter(pk__in=first)):
            done[job.pk] = job
            if not ledger.blocker(job):
                ledger.hold(job)
                chosen.append(job)
    queue = DatabaseQueue(organization_id, exclude=done)
    chosen += plan(ledger, organization_id, policy, max_wait, queue=queue)
    if quota and quota.preemption:
        done |= {job.pk: job for job in chosen}
        grace = Organization.objects.values_list("preemption_grace_seconds", flat=True).get(
            pk=organization_id
        )
        fair_after = (
            max_wait if quota.fair_share_preemption and policy == QueuePolicy.FAIR_SHARE else None
        )
        preemptions = plan_preemptions(
            ledger, organization_id, done, now=timezone.now(), fair_after=fair_after
        )
        for preemption in preemptions:
            leaving = attempts_preempt(
                [held.job_id for held in preemption.victims],
                reason=preemption.reason(),
                for_job=preemption.job.pk,
                grace_seconds=grace,
                cause=preemption.cause,
            )
            if not leaving:  # every victim stopped at once: the room is free now
                chosen.append(preemption.job)
    flavors = _gpu_flavors(ledger, chosen)
    quota_services.reservations_hold(
        chosen,
        organization_id=organization_id,
        on_host=ledger.on_host,
        host=HOST,
        gpu_flavors=flavors,
    )
    if chosen and ledger.on_host:
        # Warm clusters hold part of the host that admission does not count: what it admitted
        # now comes first, and idle warm clusters are stopped to make room for it.
        pools_yield(
            reserved={name: getattr(ledger.host, name) for name in RESOURCES},
            capacity=ledger.host_capacity,
            admitted=[job.pk for job in chosen],
        )
    if chosen and quota and any(getattr(quota, name) is not None for name in RESOURCES):
        # The organisation's kuberay warm pools hold part of its capacity in the same way.
        pools_yield(
            reserved={name: getattr(ledger.org, name) for name in RESOURCES},
            capacity={name: getattr(quota, name) for name in RESOURCES},
            admitted=[job.pk for job in chosen],
            organization_id=organization_id,
            gpu_flavors=flavors,
        )
    attempts_create(chosen, gpu_flavors=flavors)
    return [job.pk for job in chosen]


def _hold_promised(ledger: Ledger, organization_id: int) -> dict[int, Job]:
    """What preempted jobs in their grace period hold is promised to the jobs they make room
    for: those count as held (on top of the leaving jobs, which still run), so nothing else
    takes the room, and they are admitted once their victims are gone (``first``). Returns
    them by pk."""
    promised = promised_jobs(organization_id, _scan(_queued(organization_id)))
    for job in promised:
        ledger.hold(job)
    return {job.pk: job for job in promised}


def _gpu_flavors(ledger: Ledger, jobs: list[Job]) -> dict[int, str]:
    """The GPU flavor chosen for each admitted job that asks for GPUs (by pk)."""
    if ledger.flavors is None:
        return {}
    return {job.pk: ledger.flavors.flavor_of(job) for job in jobs if job.requested["gpu"]}


def admit_all() -> dict[int, list[int]]:
    """A single-flight admission pass for every organisation with queued jobs."""
    orgs = Job.objects.filter(state=JobState.QUEUED).values_list("organization_id", flat=True)
    return {org: admit_single_flight(org) for org in sorted(set(orgs))}


def explain(job: Job, *, now: dt.datetime | None = None) -> dict[str, Any] | None:
    """For a queued job: its position in its organisation's queue and what blocks it; under
    ``fair_share`` and ``intelligent``, the ``factors`` its place comes from (:func:`factors`)."""
    if job.state != JobState.QUEUED:
        return None
    queue = _queued(job.organization_id)
    ahead = queue.filter(
        Q(priority__gt=job.priority)
        | Q(priority=job.priority, queued_at__lt=job.queued_at)
        | Q(priority=job.priority, queued_at=job.queued_at, id__lt=job.pk)
    ).count()
    ledger = ledger_for(job.organization_id)
    now = now or timezone.now()
    explained: dict[str, Any] = {
        "position": ahead + 1,
        "queued": queue.count(),
        "waiting_for": ledger.blocker(job) or _queue_keeps(job, copy.deepcopy(ledger), now),
    }
    policy = ledger.org_quota.policy if ledger.org_quota else QueuePolicy.FIFO
    if policy in (QueuePolicy.FAIR_SHARE, QueuePolicy.INTELLIGENT):
        explained["factors"] = factors(ledger, job, policy, now)
    return explained


def _queue_keeps(job: Job, ledger: Ledger, now: dt.datetime) -> str:
    """What of the queue keeps ``job``, which fits on its own, out of the next pass: the pass
    a worker would run now, on ``ledger`` (a copy), writing nothing, watching the job
    (``jobs/waiting.py``)."""
    organization_id = job.organization_id
    promised = _hold_promised(ledger, organization_id)
    if job.pk in promised:
        return (
            "the room it needs is promised to it: the jobs preempted for it are leaving "
            "(their grace period)"
        )
    policy, max_wait = policy_of(ledger)
    watch = Watch(job.pk, job.workspace_id, stop=True)
    queue = DatabaseQueue(organization_id, exclude=promised)
    # In a transaction, as a pass runs: outside one, the queue's server-side cursor would be
    # WITH HOLD, which PostgreSQL fills with the whole queue before the first row.
    with transaction.atomic(), contextlib.suppress(Decided):
        # (Decided: the rest of the pass would not change what it says.)
        plan(ledger, organization_id, policy, max_wait, queue=queue, now=now, watch=watch)
    return watch.reason or NEXT_PASS


def _finite(value: float) -> float | None:
    """A share as JSON carries it: None for ∞ (a resource held without a guarantee of it)."""
    return None if value == float("inf") else round(value, 6)


def factors(ledger: Ledger, job: Job, policy: str, now: dt.datetime) -> dict[str, Any]:
    """What places a queued job, as Slurm's ``sprio`` shows it: its workspace's share of its
    guarantee now, its decayed past usage (as a share of its guarantee, and the GPU-hours it
    stands for), its weight and the fair-share key they make, the job's priority and how long
    it has waited. Under ``intelligent``: whether it keeps strict order or may be overtaken,
    and whether it has aged past being overtaken."""
    ws_id = job.workspace_id
    past = ledger.past.get(ws_id)
    gpu_seconds = past.at(now, ledger.half_life_seconds)["gpu"] if past else 0.0
    waited = max(0.0, _waited(job, now))
    explained: dict[str, Any] = {
        "current_share": _finite(ledger.dominant_share(ws_id)),
        "decayed_usage_share": _finite(ledger.usage_share(ws_id, now)),
        "decayed_gpu_hours": round(gpu_seconds / 3600, 6),
        "weight": ledger.weight(ws_id),
        "fair_share_key": _finite(ledger.fair_share_key(ws_id, now)),
        "priority": job.priority,
        "age_seconds": round(waited, 3),
    }
    path = ledger.tree.path(ws_id)
    if path:
        explained["path"] = [_group_factors(ledger, group_id, now) for group_id in path[::-1]]
    if policy == QueuePolicy.INTELLIGENT:
        strict = job.priority >= STRICT_PRIORITY
        explained["band"] = "strict" if strict else "backfill"
        explained["aged"] = not strict and waited > aging_seconds()
    return explained


def _group_factors(ledger: Ledger, group_id: int, now: dt.datetime) -> dict[str, Any]:
    """A quota group's place among its siblings, as ``factors`` shows a workspace's."""
    current, past = ledger.group_share(group_id, now)
    group = ledger.groups[group_id]
    return {
        "group": group.name,
        "current_share": _finite(current),
        "decayed_usage_share": _finite(past),
        "weight": group.fair_share_weight,
        "fair_share_key": _finite(ledger.group_key(group_id, now)),
    }
