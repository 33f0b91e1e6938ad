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
from django.db.models import Count, Q, Sum
from django.utils import timezone

from jobs.models import Job, JobState

from .models import RESOURCES, OrgQuota, QueuePolicy, Reservation, WorkspaceQuota
from .services import budget_exceeded, gpu_hours, month_start

ADVISORY_NAMESPACE = 0x6D61  # "ma": keeps our lock ids apart from other users of pg locks


@dataclasses.dataclass
class Usage:
    cpu: float = 0.0
    memory_gb: float = 0.0
    gpu: float = 0.0
    running: int = 0

    def add(self, job: Job) -> None:
        for name in RESOURCES:
            setattr(self, name, getattr(self, name) + job.requested[name])
        self.running += 1


@dataclasses.dataclass
class Ledger:
    """What is held now, and the limits to hold it against."""

    org_quota: OrgQuota | None
    ws_quotas: dict[int, WorkspaceQuota]
    org: Usage
    ws: dict[int, Usage]
    gpu_hours_used: dict[int, float] = dataclasses.field(default_factory=dict)

    def blocker(self, job: Job) -> str:
        """Why ``job`` does not fit now ('' when it does)."""
        ws_usage = self.ws[job.workspace_id]
        quota = self.ws_quotas.get(job.workspace_id)
        for name in RESOURCES:
            need = job.requested[name]
            if not need:
                continue
            limit = quota.limit()[name] if quota else None
            if limit is not None and getattr(ws_usage, name) + need > limit + 1e-9:
                return (
                    f"workspace {name} limit {limit:g}: {getattr(ws_usage, name):g} reserved, "
                    f"this job needs {need:g}"
                )
            capacity = getattr(self.org_quota, name) if self.org_quota else None
            if capacity is not None and getattr(self.org, name) + need > capacity + 1e-9:
                return (
                    f"organisation {name} capacity {capacity:g}: {getattr(self.org, name):g} "
                    f"reserved, this job needs {need:g}"
                )
        if job.workspace_id in self.gpu_hours_used:
            over = budget_exceeded(
                quota,
                None,
                job.requested["gpu"],
                job.spec.get("max_runtime_seconds", 0),
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
        org_max = self.org_quota.max_running_jobs if self.org_quota else None
        if org_max is not None and self.org.running >= org_max:
            return f"organisation max_running_jobs {org_max}: {self.org.running} running"
        return ""

    def hold(self, job: Job) -> None:
        self.org.add(job)
        self.ws[job.workspace_id].add(job)

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


def ledger_for(organization_id: int) -> Ledger:
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
    return Ledger(
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
    for job in _queued(organization_id).iterator(chunk_size=QUEUE_CHUNK):
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
        ws: _queued(organization_id).filter(workspace_id=ws).iterator(chunk_size=64)
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


def _lock(organization_id: int) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [ADVISORY_NAMESPACE, organization_id]
            )


def admit(organization_id: int) -> list[int]:
    """One admission pass for an organisation. Returns the admitted job ids."""
    from jobs.execution import attempts_create

    with transaction.atomic():
        _lock(organization_id)
        ledger = ledger_for(organization_id)
        quota = ledger.org_quota
        policy = quota.policy if quota else QueuePolicy.FIFO
        max_wait = quota.balanced_max_wait_seconds if quota else 600
        chosen = plan(ledger, organization_id, policy, max_wait)
        Reservation.objects.bulk_create(
            Reservation(
                job=job,
                organization_id=organization_id,
                workspace_id=job.workspace_id,
                **job.requested,
            )
            for job in chosen
        )
        attempts_create(chosen)
    return [job.pk for job in chosen]


def admit_all() -> dict[int, list[int]]:
    """An admission pass for every organisation with queued jobs."""
    orgs = Job.objects.filter(state=JobState.QUEUED).values_list("organization_id", flat=True)
    return {org: admit(org) for org in sorted(set(orgs))}


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
