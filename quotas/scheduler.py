"""Admission: which queued jobs may launch now, under the org's capacity and each workspace's
limits, in the order the org's policy says — and why the others wait.

One admission pass per organisation is one transaction, serialised by a PostgreSQL advisory lock
(SQLite's IMMEDIATE transactions serialise it there), so any number of workers may run it at once:
each pass reads the reservations that are held, admits what fits, and writes the new
reservations in the same transaction that moves the jobs to ``launching``.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import defaultdict
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, IntegerField, Q, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from config.db import copy_insert
from jobs.local_host import HOST, workspaces_on_host
from jobs.local_host import capacity as host_capacity
from jobs.models import Job, JobState

from .models import (
    RESOURCES,
    AdmissionRequests,
    OrgQuota,
    QueuePolicy,
    Reservation,
    WorkspaceQuota,
)
from .services import budget_exceeded, gpu_hours, month_start

ADVISORY_NAMESPACE = 0x6D61  # "ma": keeps our lock ids apart from other users of pg locks
HOST_LOCK = -1  # passes that may place jobs on the shared local host take it after their org's


@dataclasses.dataclass
class Usage:
    cpu: float = 0.0
    memory_gb: float = 0.0
    gpu: float = 0.0
    running: int = 0

    def add(self, requested: dict[str, float], sign: int = 1) -> None:
        for name in RESOURCES:
            setattr(self, name, getattr(self, name) + sign * requested[name])
        self.running += sign


@dataclasses.dataclass(frozen=True)
class Held:
    """One active reservation: what a launching/running job holds (a preemption candidate)."""

    job_id: int
    workspace_id: int
    priority: int
    admitted_at: Any
    requested: dict[str, float]


@dataclasses.dataclass
class Ledger:
    """What is held now, and the limits to hold it against."""

    org_quota: OrgQuota | None
    ws_quotas: dict[int, WorkspaceQuota]
    org: Usage
    ws: dict[int, Usage]
    gpu_hours_used: dict[int, float] = dataclasses.field(default_factory=dict)
    # The shared local host: what every organisation holds on it, what it has, and which of
    # this organisation's workspaces launch there.
    host: Usage = dataclasses.field(default_factory=Usage)
    host_capacity: dict[str, float | None] = dataclasses.field(default_factory=dict)
    on_host: set[int] = dataclasses.field(default_factory=set)

    def blocker(self, job: Job) -> str:
        """Why ``job`` does not fit now ('' when it does)."""
        return self.workspace_blocker(job) or self.org_blocker(job) or self.host_blocker(job)

    def host_blocker(self, job: Job) -> str:
        """What of the local host's capacity (shared by every organisation) stops it."""
        if job.workspace_id not in self.on_host:
            return ""
        for name in RESOURCES:
            capacity, need = self.host_capacity.get(name), job.requested[name]
            if need and capacity is not None and getattr(self.host, name) + need > capacity + 1e-9:
                return (
                    f"this host's {name} capacity {capacity:g}: {getattr(self.host, name):g} "
                    f"reserved by all organisations, this job needs {need:g}"
                )
        return ""

    def workspace_blocker(self, job: Job) -> str:
        """What of the job's own workspace stops it (limits, budget, max running): what no
        preemption of other workspaces can change."""
        ws_usage = self.ws[job.workspace_id]
        quota = self.ws_quotas.get(job.workspace_id)
        for name in RESOURCES:
            need = job.requested[name]
            limit = quota.limit()[name] if quota else None
            if need and limit is not None and getattr(ws_usage, name) + need > limit + 1e-9:
                return (
                    f"workspace {name} limit {limit:g}: {getattr(ws_usage, name):g} reserved, "
                    f"this job needs {need:g}"
                )
        if job.workspace_id in self.gpu_hours_used:
            over = budget_exceeded(
                quota,
                None,
                job.requested["gpu"],
                max_runtime_of(job),
                used=self.gpu_hours_used[job.workspace_id],
            )
            if over:
                return over + "; it waits for the next budget period"
        if (
            quota
            and quota.max_running_jobs is not None
            and ws_usage.running >= quota.max_running_jobs
        ):
            return (
                f"workspace max_running_jobs {quota.max_running_jobs}: {ws_usage.running} running"
            )
        return ""

    def org_blocker(self, job: Job) -> str:
        """What of the organisation's capacity stops it: what others hold."""
        for name in self.short_of(job):
            capacity = getattr(self.org_quota, name)
            return (
                f"organisation {name} capacity {capacity:g}: {getattr(self.org, name):g} "
                f"reserved, this job needs {job.requested[name]:g}"
            )
        org_max = self.org_quota.max_running_jobs if self.org_quota else None
        if org_max is not None and self.org.running >= org_max:
            return f"organisation max_running_jobs {org_max}: {self.org.running} running"
        return ""

    def short_of(self, job: Job) -> list[str]:
        """The resources the organisation has too little of left for ``job``."""
        if self.org_quota is None:
            return []
        return [
            name
            for name in RESOURCES
            if job.requested[name]
            and getattr(self.org_quota, name) is not None
            and getattr(self.org, name) + job.requested[name] > getattr(self.org_quota, name) + 1e-9
        ]

    def hold(self, job: Job | Held, sign: int = 1) -> None:
        """Count what ``job`` holds (``sign=-1``: stop counting it)."""
        self.org.add(job.requested, sign)
        self.ws[job.workspace_id].add(job.requested, sign)
        if job.workspace_id in self.on_host:
            self.host.add(job.requested, sign)

    def guarantee(self, workspace_id: int) -> dict[str, float]:
        quota = self.ws_quotas.get(workspace_id)
        return quota.guaranteed() if quota else dict.fromkeys(RESOURCES, 0.0)

    def within_guarantee(self, job: Job) -> bool:
        """Whether the job, added to what its workspace holds, stays within its guarantee of
        every resource the organisation caps (an uncapped resource is never short)."""
        guaranteed, usage = self.guarantee(job.workspace_id), self.ws[job.workspace_id]
        return all(
            getattr(usage, name) + job.requested[name] <= guaranteed[name] + 1e-9
            for name in RESOURCES
            if self.org_quota is not None and getattr(self.org_quota, name) is not None
        )

    def borrowing(self, workspace_id: int, name: str) -> bool:
        """Whether the workspace holds more of ``name`` than it is guaranteed (only a resource
        the organisation caps can be borrowed)."""
        if self.org_quota is None or getattr(self.org_quota, name) is None:
            return False
        return getattr(self.ws[workspace_id], name) > self.guarantee(workspace_id)[name] + 1e-9

    def dominant_share(self, workspace_id: int) -> float:
        quota = self.ws_quotas.get(workspace_id)
        usage = self.ws[workspace_id]
        shares = []
        for name in RESOURCES:
            guaranteed = quota.guaranteed()[name] if quota else 0
            used = getattr(usage, name)
            if guaranteed > 0:
                shares.append(used / guaranteed)
            elif used > 0:
                shares.append(float("inf"))
        return max(shares, default=0.0)


def ledger_for(organization_id: int, on_host: set[int] | None = None) -> Ledger:
    """What the organisation holds, against its limits and those of the local host
    (``on_host``: its workspaces that launch there, when the caller has them already)."""
    held = (
        Reservation.objects.filter(organization_id=organization_id, released_at__isnull=True)
        .values("workspace_id")
        .annotate(cpu=Sum("cpu"), memory_gb=Sum("memory_gb"), gpu=Sum("gpu"), running=Count("id"))
    )
    ws: dict[int, Usage] = defaultdict(Usage)
    org = Usage()
    for row in held:
        usage = Usage(row["cpu"] or 0, row["memory_gb"] or 0, row["gpu"] or 0, row["running"])
        ws[row["workspace_id"]] = usage
        for name in (*RESOURCES, "running"):
            setattr(org, name, getattr(org, name) + getattr(usage, name))
    ws_quotas = {
        q.workspace_id: q
        for q in WorkspaceQuota.objects.filter(
            workspace__organization_id=organization_id
        ).select_related("workspace")
    }
    period = month_start()
    if on_host is None:
        on_host = workspaces_on_host(organization_id)
    host = Usage()
    if on_host:
        totals = Reservation.objects.filter(host=HOST, released_at__isnull=True).aggregate(
            cpu=Sum("cpu"), memory_gb=Sum("memory_gb"), gpu=Sum("gpu"), running=Count("id")
        )
        host = Usage(*(totals[name] or 0 for name in (*RESOURCES, "running")))
    return Ledger(
        host=host,
        host_capacity=host_capacity() if on_host else {},
        on_host=on_host,
        org_quota=OrgQuota.objects.filter(organization_id=organization_id).first(),
        ws_quotas=ws_quotas,
        org=org,
        ws=ws,
        gpu_hours_used={
            ws_id: gpu_hours(q.workspace, period)
            for ws_id, q in ws_quotas.items()
            if q.gpu_hours_per_month is not None
        },
    )


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
)


def max_runtime_of(job: Job) -> int:
    if hasattr(job, "max_runtime"):  # annotated by the queue scan
        return job.max_runtime or 0
    return job.spec.get("max_runtime_seconds", 0)


def _scan(queryset):
    return queryset.only(*PLAN_FIELDS).annotate(
        max_runtime=Cast(KT("spec__max_runtime_seconds"), IntegerField())
    )


def _queued(organization_id: int):
    """Queued jobs in base order: priority (9 first), then time queued, then id."""
    return Job.objects.filter(organization_id=organization_id, state=JobState.QUEUED).order_by(
        "-priority", "queued_at", "id"
    )


def plan(ledger: Ledger, organization_id: int, policy: str, max_wait: float) -> list[Job]:
    """The jobs to admit now, in admission order (``ledger`` is updated as they are held).

    The queue is read lazily, in chunks, so a pass costs what it admits, not what is queued.
    """
    if policy == QueuePolicy.FAIR_SHARE:
        return _plan_fair_share(ledger, organization_id)
    admitted: list[Job] = []
    now = timezone.now()
    misses = 0
    for job in _scan(_queued(organization_id)).iterator(chunk_size=QUEUE_CHUNK):
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


def _plan_fair_share(ledger: Ledger, organization_id: int) -> list[Job]:
    """Next job from the workspace with the lowest dominant share, until no workspace's head
    fits; each workspace's queue is read on demand."""
    workspace_ids = (
        Job.objects.filter(organization_id=organization_id, state=JobState.QUEUED)
        .order_by()  # no default ordering: it would defeat the DISTINCT
        .values_list("workspace_id", flat=True)
        .distinct()
    )
    queues = {
        ws: _scan(_queued(organization_id).filter(workspace_id=ws)).iterator(chunk_size=64)
        for ws in workspace_ids
    }
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


def _held(organization_id: int) -> list[Held]:
    """The active reservations of an organisation, in preemption order: lowest priority first,
    then the newest admission first (it has lost the least work)."""
    rows = (
        Reservation.objects.filter(organization_id=organization_id, released_at__isnull=True)
        .order_by("job__priority", "-created_at", "-job_id")
        .values_list("job_id", "workspace_id", "job__priority", "created_at", *RESOURCES)
    )
    return [
        Held(job_id, ws_id, priority, at, dict(zip(RESOURCES, amounts, strict=True)))
        for job_id, ws_id, priority, at, *amounts in rows
    ]


@dataclasses.dataclass
class Preemption:
    job: Job  # the queued job that gets its guarantee back
    victims: list[Held]

    def reason(self) -> str:
        return (
            f"preempted for job {self.job.pk} of workspace {self.job.workspace.slug}, "
            "which is under its guarantee"
        )


def _victims_for(ledger: Ledger, job: Job, candidates: list[Held]) -> list[Held] | None:
    """Borrowed reservations whose release makes room for ``job`` (``ledger`` is updated), or
    None when even all of them would not (then nothing is released)."""
    chosen: list[Held] = []
    for held in candidates:
        if held.workspace_id == job.workspace_id:
            continue
        short = ledger.short_of(job)
        running_full = not short and ledger.org_blocker(job) != ""
        useful = any(
            held.requested[name] > 0 and ledger.borrowing(held.workspace_id, name)
            for name in (short or (RESOURCES if running_full else ()))
        )
        if not useful:
            continue
        ledger.hold(held, -1)
        chosen.append(held)
        if not ledger.blocker(job):
            return chosen
    for held in chosen:
        ledger.hold(held)
    return None


def plan_preemptions(ledger: Ledger, organization_id: int, admitted: set[int]) -> list[Preemption]:
    """Give guarantees back: for each workspace whose next queued job fits within its guarantee
    but not in what is left, preempt running jobs of workspaces above their guarantee
    (borrowers) until it fits. One job per workspace per pass; the requeued victims trigger the
    next pass. Victims never come from a workspace within its guarantee, and a job that fits
    within its own guarantee can never be one, so two workspaces cannot preempt each other."""
    preemptions: list[Preemption] = []
    if not any(ledger.borrowing(ws, name) for ws in list(ledger.ws) for name in RESOURCES):
        return preemptions  # nobody holds more than their guarantee: there is nothing to take
    candidates: list[Held] | None = None
    for workspace_id, quota in ledger.ws_quotas.items():
        guaranteed, usage = quota.guaranteed(), ledger.ws[workspace_id]
        if not any(getattr(usage, name) < guaranteed[name] for name in RESOURCES):
            continue  # at or above its guarantee: it has nothing to take back
        job = (
            _queued(organization_id)
            .filter(workspace_id=workspace_id)
            .exclude(pk__in=admitted)
            .select_related("workspace")
            .first()
        )
        if job is None or not ledger.within_guarantee(job) or ledger.workspace_blocker(job):
            continue
        if not ledger.org_blocker(job):
            continue  # it fits without anyone leaving (the policy held it back)
        if candidates is None:
            candidates = _held(organization_id)
        victims = _victims_for(ledger, job, candidates)
        if victims is None:
            continue
        ledger.hold(job)
        preemptions.append(Preemption(job, victims))
        gone = {held.job_id for held in victims}
        candidates = [held for held in candidates if held.job_id not in gone]
    return preemptions


def _lock(organization_id: int, *, wait: bool = True) -> bool:
    """Take the organisation's admission lock for this transaction (SQLite's IMMEDIATE
    transactions already serialise writers). Without ``wait``, False when a pass holds it."""
    if connection.vendor != "postgresql":
        return True
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, %s)", [ADVISORY_NAMESPACE, organization_id])
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
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO quotas_admissionrequests (organization_id, requested, served) "
            "VALUES (%s, 1, 0) ON CONFLICT (organization_id) "
            "DO UPDATE SET requested = quotas_admissionrequests.requested + 1",
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
    from jobs.execution import attempts_create, attempts_preempt

    on_host = workspaces_on_host(organization_id)
    if on_host and connection.vendor == "postgresql":
        # The local host is shared by every organisation: one pass at a time reserves on it.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [ADVISORY_NAMESPACE, HOST_LOCK])
    ledger = ledger_for(organization_id, on_host)
    quota = ledger.org_quota
    policy = quota.policy if quota else QueuePolicy.FIFO
    max_wait = quota.balanced_max_wait_seconds if quota else 600
    chosen = plan(ledger, organization_id, policy, max_wait)
    if quota and quota.preemption:
        preemptions = plan_preemptions(ledger, organization_id, {job.pk for job in chosen})
        for preemption in preemptions:
            attempts_preempt(
                [held.job_id for held in preemption.victims],
                reason=preemption.reason(),
                for_job=preemption.job.pk,
            )
            chosen.append(preemption.job)
    copy_insert(
        Reservation,
        (
            Reservation(
                job=job,
                organization_id=organization_id,
                workspace_id=job.workspace_id,
                host=HOST if job.workspace_id in ledger.on_host else "",
                **job.requested,
            )
            for job in chosen
        ),
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


def release(job: Job) -> int:
    """Release the job's reservation (in the caller's transaction). Returns how many rows."""
    return Reservation.objects.filter(job=job, released_at__isnull=True).update(
        released_at=timezone.now()
    )
