"""Admission: which queued jobs may launch now, under the org's capacity and each workspace's
limits, in the order the org's policy says — and why the others wait.

One admission pass per organisation is one transaction, serialised by a PostgreSQL advisory lock
(SQLite's IMMEDIATE transactions serialise it there), so any number of workers may run it at once:
each pass reads the reservations that are held (``quotas.selectors.ledger_for``), admits what
fits (the arithmetic is ``quotas/ledger.py``), and writes the new reservations in the same
transaction that moves the jobs to ``launching``. Leaving ``launching``/``running`` releases
them: ``jobs.state.transition`` does that in the same transaction as the move.

At submission, :func:`check_submission` refuses a job that could never run, or that the
workspace's queue or GPU budget has no room for.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import connection, transaction
from django.db.models import F, IntegerField, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone
from rest_framework import status

from config.errors import Conflict, DomainError, InvalidInput
from quotas import selectors as quota_selectors
from quotas import services as quota_services
from quotas.ledger import Held, Ledger, budget_overrun, month_start, victims_for
from quotas.models import RESOURCES, AdmissionRequests, QueuePolicy

from .accounting import gpu_hours
from .attempts import attempts_create, attempts_preempt
from .local_host import HOST, workspaces_on_host
from .local_host import capacity as host_capacity
from .models import Job, JobState

ADVISORY_NAMESPACE = 0x6D61  # "ma": keeps our lock ids apart from other users of pg locks
HOST_LOCK = -1  # passes that may place jobs on the shared local host take it after their org's
QUEUE_CHUNK = 500  # queued rows fetched at a time: a pass reads only as far as it admits
MAX_BLOCKED_SCAN = 1000  # round_robin/balanced: stop after this many misses in a row

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
    )


# --- the queue -----------------------------------------------------------------------------


def _scan(queryset):
    return queryset.only(*PLAN_FIELDS).annotate(
        scanned_max_runtime=Cast(KT("spec__max_runtime_seconds"), IntegerField())
    )


def _queued(organization_id: int):
    """Queued jobs in base order: priority (9 first), then time queued, then id."""
    return Job.objects.filter(organization_id=organization_id, state=JobState.QUEUED).order_by(
        "-priority", "queued_at", "id"
    )


class DatabaseQueue:
    """The queue an admission pass reads: the organisation's queued jobs, in base order, read
    lazily from the database. A prediction (``jobs/prediction.py``) hands :func:`plan` a queue
    of its own, held in memory, with the same two methods."""

    def __init__(self, organization_id: int):
        self.organization_id = organization_id

    def jobs(self, workspace_id: int | None = None) -> Iterator[Job]:
        """Queued jobs (of one workspace, when given) in base order."""
        queued = _queued(self.organization_id)
        if workspace_id is None:
            return _scan(queued).iterator(chunk_size=QUEUE_CHUNK)
        return _scan(queued.filter(workspace_id=workspace_id)).iterator(chunk_size=64)

    def workspace_ids(self) -> Iterable[int]:
        """The workspaces with queued jobs."""
        return (
            Job.objects.filter(organization_id=self.organization_id, state=JobState.QUEUED)
            .order_by()  # no default ordering: it would defeat the DISTINCT
            .values_list("workspace_id", flat=True)
            .distinct()
        )


def plan(
    ledger: Ledger,
    organization_id: int,
    policy: str,
    max_wait: float,
    *,
    queue: DatabaseQueue | None = None,
    now: dt.datetime | None = None,
) -> list[Job]:
    """The jobs to admit now, in admission order (``ledger`` is updated as they are held).

    The queue is read lazily, in chunks, so a pass costs what it admits, not what is queued.
    ``queue`` and ``now`` default to the database's queue and the present; a prediction passes
    a simulated queue and clock.
    """
    queue = queue or DatabaseQueue(organization_id)
    if policy == QueuePolicy.FAIR_SHARE:
        return _plan_fair_share(ledger, organization_id, queue)
    admitted: list[Job] = []
    now = now or timezone.now()
    misses = 0
    for job in queue.jobs():
        if ledger.blocker(job):
            if policy == QueuePolicy.FIFO:
                break
            waited = (now - (job.queued_at or now)).total_seconds()
            if policy == QueuePolicy.BALANCED and waited > max_wait:
                break  # it has waited long enough: nothing may overtake it any more
            misses += 1
            if misses >= MAX_BLOCKED_SCAN:
                break
            continue
        misses = 0
        ledger.hold(job)
        admitted.append(job)
    return admitted


def _fair_key(ledger: Ledger, ws_id: int, job: Job) -> tuple:
    return (ledger.dominant_share(ws_id), -job.priority, job.queued_at, job.pk, ws_id, job)


def _plan_fair_share(ledger: Ledger, organization_id: int, queue: DatabaseQueue) -> list[Job]:
    """Next job from the workspace with the lowest dominant share, until no workspace's head
    fits; each workspace's queue is read on demand."""
    queues = {ws: queue.jobs(ws) for ws in queue.workspace_ids()}
    # A heap of each workspace's head, keyed by its workspace's dominant share: only the
    # workspace that just got a job changes its share, so the heap stays valid.
    heap = []
    for ws, queue in queues.items():
        head = next(queue, None)
        if head is not None:
            heapq.heappush(heap, _fair_key(ledger, ws, head))
    admitted: list[Job] = []
    while heap:
        *_, ws_id, job = heapq.heappop(heap)
        if ledger.blocker(job):
            continue  # its head does not fit: the workspace waits this pass
        ledger.hold(job)
        admitted.append(job)
        following = next(queues[ws_id], None)
        if following is not None:
            heapq.heappush(heap, _fair_key(ledger, ws_id, following))
    return admitted


# --- preemption ----------------------------------------------------------------------------


@dataclasses.dataclass
class Preemption:
    job: Job  # the queued job that gets its guarantee back
    victims: list[Held]

    def reason(self) -> str:
        return (
            f"preempted for job {self.job.pk} of workspace {self.job.workspace.slug}, "
            "which is under its guarantee"
        )


def _heads(organization_id: int, workspace_ids: list[int], admitted: set[int]) -> dict[int, Job]:
    """The next queued job (in base order, ``admitted`` aside) of each of these workspaces that
    has one: one query on PostgreSQL (DISTINCT ON), where a query per workspace made a pass
    of an organisation with many workspaces under their guarantee cost one query each."""
    if not workspace_ids:
        return {}
    queued = (
        _queued(organization_id)
        .filter(workspace_id__in=workspace_ids)
        .exclude(pk__in=admitted)
        .select_related("workspace")
    )
    if connection.vendor == "postgresql":
        firsts = queued.order_by("workspace_id", "-priority", "queued_at", "id")
        return {job.workspace_id: job for job in firsts.distinct("workspace_id")}
    found = (queued.filter(workspace_id=ws).first() for ws in workspace_ids)
    return {job.workspace_id: job for job in found if job is not None}


def plan_preemptions(ledger: Ledger, organization_id: int, admitted: set[int]) -> list[Preemption]:
    """Give guarantees back: for each workspace whose next queued job fits within its guarantee
    but not in what is left, preempt running jobs of workspaces above their guarantee
    (borrowers) until it fits. One job per workspace per pass; the requeued victims trigger the
    next pass. Victims never come from a workspace within its guarantee, and a job that fits
    within its own guarantee can never be one, so two workspaces cannot preempt each other."""
    preemptions: list[Preemption] = []
    if not ledger.anyone_borrowing():
        return preemptions  # nobody holds more than their guarantee: there is nothing to take
    candidates: list[Held] | None = None
    under = {ws for ws in ledger.ws_quotas if ledger.under_guarantee(ws)}
    heads = _heads(organization_id, sorted(under), admitted)
    for workspace_id in ledger.ws_quotas:
        if not ledger.under_guarantee(workspace_id):
            continue  # at or above its guarantee: it has nothing to take back
        if workspace_id in under:
            job = heads.get(workspace_id)
        else:  # not read above: it fell under its guarantee when a victim of it left
            job = _heads(organization_id, [workspace_id], admitted).get(workspace_id)
        if job is None or not ledger.within_guarantee(job) or ledger.workspace_blocker(job):
            continue
        if not ledger.org_blocker(job):
            continue  # it fits without anyone leaving (the policy held it back)
        if candidates is None:
            candidates = quota_selectors.held_in_preemption_order(organization_id)
        victims = victims_for(ledger, job, candidates)
        if victims is None:
            continue
        ledger.hold(job)
        preemptions.append(Preemption(job, victims))
        gone = {held.job_id for held in victims}
        candidates = [held for held in candidates if held.job_id not in gone]
    return preemptions


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


def admit(organization_id: int) -> list[int]:
    """One admission pass for an organisation, waiting for a pass in progress to finish.
    Returns the admitted job ids."""
    with transaction.atomic():
        _lock(organization_id)
        return _admit_locked(organization_id)


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
    table = AdmissionRequests._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (organization_id, requested, served) "
            "VALUES (%s, 1, 0) ON CONFLICT (organization_id) "
            f"DO UPDATE SET requested = {table}.requested + 1",
            [organization_id],
        )
    admitted: list[int] = []
    while True:
        with transaction.atomic():
            if not _lock(organization_id, wait=False):
                return admitted  # the pass holding the lock serves this request
            requested = requests.values_list("requested", flat=True).get()
            admitted += _admit_locked(organization_id)
            requests.update(served=requested)
        if not requests.filter(requested__gt=F("served")).exists():
            return admitted


def _admit_locked(organization_id: int) -> list[int]:
    on_host = workspaces_on_host(organization_id)
    if on_host:
        _lock(HOST_LOCK)  # the local host is shared by every organisation: one pass reserves
    ledger = ledger_for(organization_id, on_host)
    quota = ledger.org_quota
    policy = quota.policy if quota else QueuePolicy.FIFO
    max_wait = quota.balanced_max_wait_seconds if quota else 600
    chosen = plan(ledger, organization_id, policy, max_wait)
    if quota and quota.preemption:
        for preemption in plan_preemptions(ledger, organization_id, {job.pk for job in chosen}):
            attempts_preempt(
                [held.job_id for held in preemption.victims],
                reason=preemption.reason(),
                for_job=preemption.job.pk,
            )
            chosen.append(preemption.job)
    quota_services.reservations_hold(
        chosen, organization_id=organization_id, on_host=ledger.on_host, host=HOST
    )
    attempts_create(chosen)
    return [job.pk for job in chosen]


def admit_all() -> dict[int, list[int]]:
    """A single-flight admission pass for every organisation with queued jobs."""
    orgs = Job.objects.filter(state=JobState.QUEUED).values_list("organization_id", flat=True)
    return {org: admit_single_flight(org) for org in sorted(set(orgs))}


def explain(job: Job) -> dict[str, Any] | None:
    """For a queued job: its position in its organisation's queue and what blocks it."""
    if job.state != JobState.QUEUED:
        return None
    queue = _queued(job.organization_id)
    ahead = queue.filter(
        Q(priority__gt=job.priority)
        | Q(priority=job.priority, queued_at__lt=job.queued_at)
        | Q(priority=job.priority, queued_at=job.queued_at, id__lt=job.pk)
    ).count()
    reason = ledger_for(job.organization_id).blocker(job)
    if not reason:
        reason = "waiting for the next admission pass"
    return {"position": ahead + 1, "queued": queue.count(), "waiting_for": reason}


# --- at submission -------------------------------------------------------------------------


class BudgetExhausted(Conflict):
    type = "budget_exhausted"


class QueueFull(DomainError):
    type = "queue_full"
    status_code = status.HTTP_429_TOO_MANY_REQUESTS


def check_submission(
    workspace,
    requested: dict[str, float],
    spec: dict[str, Any],
    host_capacity: dict[str, float | None] | None = None,
) -> None:
    """Refuse a job that can never run here (over its workspace's limit, its organisation's
    capacity, or the capacity of the host it launches on), one the workspace's queue has no
    room for, or one over the GPU budget when the workspace refuses those (otherwise it waits
    for next month)."""
    org_q = quota_selectors.org_quota(workspace.organization)  # unlimited when unset
    ws_q = quota_selectors.workspace_quota(workspace)
    for name in RESOURCES:
        need = requested[name]
        ceilings = (
            (ws_q.limit()[name], "the workspace limit is"),
            (org_q.capacity()[name], "the organisation's capacity is"),
            ((host_capacity or {}).get(name), "the host its workspace launches on has"),
        )
        for ceiling, what in ceilings:
            if ceiling is not None and need > ceiling:
                raise InvalidInput.on(
                    f"requested.{name}",
                    f"this job needs {need:g} {name}; {what} {ceiling:g}, so it could never run",
                )
    if ws_q.gpu_hours_per_month is not None and requested["gpu"]:
        used = gpu_hours(workspace, month_start(timezone.now()))
        over = budget_overrun(ws_q, used, requested["gpu"], spec["max_runtime_seconds"])
        if over and ws_q.budget_action == "refuse":
            raise BudgetExhausted(over, errors={"requested.gpu": [over]})
    if ws_q.max_queued_jobs is not None:
        waiting = Job.objects.filter(
            workspace=workspace, state__in=[JobState.PENDING_APPROVAL, JobState.QUEUED]
        ).count()
        if waiting >= ws_q.max_queued_jobs:
            raise QueueFull(
                f"the workspace already has {waiting} waiting jobs (max_queued_jobs "
                f"{ws_q.max_queued_jobs}); try again when some have started",
                errors={"max_queued_jobs": [str(ws_q.max_queued_jobs)]},
            )
