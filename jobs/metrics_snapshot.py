"""The levels ``/metrics`` reports from the database, taken by the sweep and kept in one cache
entry, so that a scrape reads one key and runs no SQL, however many jobs there are.

Why a snapshot and not counters kept in the transition's transaction: the levels here are not
only job counts — why each queued job waits depends on every quota and reservation of its
organisation, and GPU-hours grow with time, not with events — so they would need the same reads
anyway; and a counter row per (workspace, state) updated by every transition would be one more
hot row that every admission pass of a workspace writes. The sweep already runs on every worker's
beat (``MANTA_SWEEP_INTERVAL_SECONDS``, 15 s by default): the levels are at most that old, and
``manta_worker_heartbeat_timestamp_seconds`` (the snapshot's time) says how old.

A refresh costs a fixed number of aggregate queries (jobs by workspace and state, queued jobs by
workspace and shape, quotas, reservations, this month's GPU attempts), plus a few per
organisation with queued jobs (its admission ledger, to say why they wait).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, IntegerField, Min, Q, Sum
from django.db.models.fields.json import KT, KeyTransform
from django.db.models.functions import Cast
from django.utils import timezone
from redis.exceptions import RedisError

from quotas import selectors as quota_selectors
from quotas.flavors import flavor_budgets
from quotas.ledger import month_start
from quotas.models import RESOURCES, OrgQuota, QuotaGroup, WorkspaceQuota
from workspaces.models import Workspace

from .admission import ledger_for
from .models import Job, JobAttempt, JobState, WarmPool

logger = logging.getLogger(__name__)
CACHE_KEY = "metrics:snapshot:v1"
WAITING_STATES = (
    JobState.PENDING_APPROVAL,
    JobState.QUEUED,
    JobState.LAUNCHING,
    JobState.RUNNING,
    JobState.PREEMPTING,
)
# Why a job waits (``manta_pending_jobs{reason}``): the categories of the why-waiting text that
# ``jobs/admission.py``'s explain gives one job (``quotas/ledger.py``'s blockers).
REASONS = (
    "approval",  # pending_approval: an admin has to decide
    "workspace_limit",  # the workspace's own limit on a resource
    "workspace_max_running",
    "gpu_budget",  # the workspace's GPU-hours this month
    "group_limit",  # a quota group above the workspace is at its limit
    "group_max_running",
    "org_capacity",  # what the organisation's other jobs hold
    "org_max_running",
    "gpu_flavor",  # no GPU flavor the job accepts has room (at any level, or its budget is spent)
    "host_capacity",  # the shared local host is full
    "admission_pass",  # it fits: the next pass (or the queue's order) admits it
)


@dataclasses.dataclass
class Shape:
    """Queued jobs of one workspace that ask for the same resources: they wait for one reason."""

    workspace_id: int
    requested: dict[str, float]
    max_runtime_seconds: int
    pk: int = 0
    gpu_flavors: tuple[str, ...] = ()  # the GPU flavors they accept, in order (empty: any)


def reason_of(ledger, claim) -> str:
    """The category of what blocks ``claim`` now (``admission_pass`` when nothing does)."""
    blocker = ledger.workspace_blocker(claim)
    if blocker:
        if blocker.startswith("GPU budget"):
            return "gpu_budget"
        return "workspace_max_running" if "max_running_jobs" in blocker else "workspace_limit"
    blocker = ledger.org_blocker(claim)
    if blocker:
        level = "group" if blocker.startswith("group") else "org"
        kind = (
            "max_running"
            if "max_running_jobs" in blocker
            else ("limit" if level == "group" else "capacity")
        )
        return f"{level}_{kind}"
    if ledger.flavor_blocker(claim):
        return "gpu_flavor"
    return "host_capacity" if ledger.host_blocker(claim) else "admission_pass"


def snapshot_refresh(*, drift: dict[str, int] | None = None) -> dict[str, Any]:
    """Take the levels now and store them for the scrapes; returns the snapshot. ``drift`` is
    the sweep's reconciliation, when it has one."""
    if drift is None:
        from .accounting import reconcile

        drift = reconcile()
    now = timezone.now()
    workspaces = {
        pk: (org, slug)
        for pk, org, slug in Workspace.objects.values_list("pk", "organization__slug", "slug")
    }
    jobs = {}
    for ws_id, state, count, oldest in (
        Job.objects.order_by()
        .values_list("workspace_id", "state")
        .annotate(n=Count("id"), oldest=Min("updated_at", filter=Q(state__in=WAITING_STATES)))
    ):
        jobs[f"{ws_id}:{state}"] = [count, oldest.timestamp() if oldest else None]
    reserved = _reserved()
    snapshot = {
        "taken_at": now.timestamp(),
        "workspaces": {str(pk): list(names) for pk, names in workspaces.items()},
        "jobs": jobs,
        "pending": _pending(jobs),
        "quotas": _quotas(),
        "capacity": _capacity(),
        "reserved": reserved,
        "groups": _groups(reserved),
        **_gpu_hours(now),
        "flavors_reserved": _flavors_reserved(),
        "drift": drift,
        "queue_depth": _queue_depth(),
        "warm_pools": _warm_pools(now),
    }
    try:
        cache.set(CACHE_KEY, snapshot, timeout=None)
    except (RedisError, OSError):
        logger.warning("metrics snapshot not kept: cache unavailable", exc_info=True)
    return snapshot


def snapshot() -> dict[str, Any] | None:
    """The latest snapshot (one cache read, no SQL), or None before the first sweep or while
    the cache is away (the scrape then reports only the counters)."""
    try:
        return cache.get(CACHE_KEY)
    except (RedisError, OSError):
        logger.warning("metrics snapshot unavailable: cache unavailable", exc_info=True)
        return None


def _pending(jobs: dict[str, list]) -> dict[str, int]:
    pending: dict[str, int] = {}
    for key, (count, _) in jobs.items():
        ws_id, _, state = key.partition(":")
        if state == JobState.PENDING_APPROVAL:
            pending[f"{ws_id}:approval"] = count
    shapes = (
        Job.objects.filter(state=JobState.QUEUED)
        .order_by()
        .annotate(
            runtime=Cast(KT("spec__max_runtime_seconds"), IntegerField()),
            flavors=KeyTransform("gpu_flavor", "spec"),
        )
        .values_list(
            "organization_id",
            "workspace_id",
            "requested_cpu",
            "requested_memory_gb",
            "requested_gpu",
            "requested_disk_gb",
            "runtime",
            "flavors",
        )
        .annotate(n=Count("id"))
    )
    ledgers = {}
    for org_id, ws_id, cpu, memory, gpu, disk, runtime, flavors, count in shapes:
        if org_id not in ledgers:
            ledgers[org_id] = ledger_for(org_id)
        requested = {"cpu": cpu, "memory_gb": memory, "gpu": gpu, "disk_gb": disk}
        shape = Shape(ws_id, requested, runtime or 0, gpu_flavors=tuple(flavors or ()))
        reason = reason_of(ledgers[org_id], shape)
        key = f"{ws_id}:{reason}"
        pending[key] = pending.get(key, 0) + count
    return pending


def _quotas() -> dict[str, dict[str, Any]]:
    quotas = {}
    for quota in WorkspaceQuota.objects.all():
        quotas[str(quota.workspace_id)] = {
            "guaranteed": quota.guaranteed(),
            "limit": {name: value for name, value in quota.limit().items() if value is not None},
            "gpu_hours_budget": quota.gpu_hours_per_month,
            "flavor_gpu_hours_budget": flavor_budgets(quota.gpu_flavors),
        }
    return quotas


def _groups(reserved: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Each quota group's guarantee, limit (where set) and what its subtree holds: the
    workspaces' reservations (``reserved``) summed up the tree. Two queries."""
    groups = {g.pk: g for g in QuotaGroup.objects.select_related("organization")}
    leaves = WorkspaceQuota.objects.filter(group__isnull=False).values_list(
        "workspace_id", "group_id"
    )
    held: dict[int, dict[str, float]] = {pk: dict.fromkeys(RESOURCES, 0.0) for pk in groups}
    for ws_id, group_id in leaves:
        amounts = reserved.get(str(ws_id), {})
        node, seen = group_id, set()
        while node in groups and node not in seen:  # up to the organisation
            seen.add(node)
            for name in RESOURCES:
                held[node][name] += amounts.get(name, 0.0)
            node = groups[node].parent_id
    return {
        str(pk): {
            "organization": group.organization.slug,
            "group": group.name,
            "guaranteed": group.guaranteed(),
            "limit": {name: value for name, value in group.limit().items() if value is not None},
            "reserved": held[pk],
        }
        for pk, group in groups.items()
    }


def _capacity() -> dict[str, dict[str, float]]:
    return {
        slug: {name: value for name, value in quota.capacity().items() if value is not None}
        for slug, quota in (
            (quota.organization.slug, quota)
            for quota in OrgQuota.objects.select_related("organization")
        )
    }


def _reserved() -> dict[str, dict[str, float]]:
    rows = (
        quota_selectors.active_reservations()
        .order_by()
        .values("workspace_id")
        .annotate(**{name: Sum(name) for name in RESOURCES})
    )
    return {
        str(row["workspace_id"]): {name: row[name] or 0.0 for name in RESOURCES} for row in rows
    }


def _flavors_reserved() -> dict[str, dict[str, float]]:
    """The GPUs each workspace's reservations hold, by GPU flavor (typed ones only: the
    totals already count the untyped)."""
    rows = (
        quota_selectors.active_reservations()
        .exclude(gpu_flavor="")
        .order_by()
        .values_list("workspace_id", "gpu_flavor")
        .annotate(gpus=Sum("gpu"))
    )
    held: dict[str, dict[str, float]] = {}
    for ws_id, flavor, gpus in rows:
        held.setdefault(str(ws_id), {})[flavor] = gpus or 0.0
    return held


def _gpu_hours(now) -> dict[str, dict]:
    """GPU-hours of each workspace's attempts this month (``jobs/accounting.py``'s measure),
    in all (``gpu_hours``) and by typed GPU flavor (``flavor_gpu_hours``), from one read of
    this month's GPU attempts."""
    since = month_start(now)
    used: dict[str, float] = {}
    by_flavor: dict[str, dict[str, float]] = {}
    attempts = (
        JobAttempt.objects.filter(running_at__isnull=False, job__requested_gpu__gt=0)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
        .values_list(
            "job__workspace_id", "running_at", "finished_at", "job__requested_gpu", "gpu_flavor"
        )
    )
    for ws_id, running_at, finished_at, gpu, flavor in attempts:
        start, end = max(running_at, since), finished_at or now
        if end > start:
            key, hours = str(ws_id), (end - start).total_seconds() / 3600 * gpu
            used[key] = used.get(key, 0.0) + hours
            if flavor:
                flavors = by_flavor.setdefault(key, {})
                flavors[flavor] = flavors.get(flavor, 0.0) + hours
    return {"gpu_hours": used, "flavor_gpu_hours": by_flavor}


def _warm_pools(now) -> dict[str, dict[str, Any]]:
    """Each warm pool's size and clusters by state, and the age of its oldest idle cluster
    (one query)."""
    levels = {}
    states = ("starting", "idle", "claimed", "retiring")
    rows = WarmPool.objects.values_list("pk", "organization__slug", "target_name", "size").annotate(
        **{state: Count("clusters", filter=Q(clusters__state=state)) for state in states},
        oldest=Min("clusters__ready_at", filter=Q(clusters__state="idle")),
    )
    for pk, org, target, size, *counts, oldest in rows:
        levels[str(pk)] = {
            "labels": [org, target],
            "size": size,
            "clusters": dict(zip(states, counts, strict=True)),
            "oldest_idle_seconds": (now - oldest).total_seconds() if oldest else 0.0,
        }
    return levels


def _queue_depth() -> dict[str, int]:
    """Messages waiting in the broker's default queue (countdown tasks a worker holds are not
    there): LLEN over Redis's priority lists, or the files of the embedded broker's folder."""
    queue = getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery")
    broker = settings.CELERY_BROKER_URL
    try:
        if broker.startswith(("redis://", "rediss://")):
            import redis

            client = redis.Redis.from_url(broker, socket_timeout=2, socket_connect_timeout=2)
            names = [queue, *(f"{queue}\x06\x16{step}" for step in (3, 6, 9))]
            return {queue: sum(client.llen(name) for name in names)}
        if broker.startswith("filesystem://"):
            folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
            return {queue: sum(1 for _ in folder.glob(f"*_{queue}.msg"))}
    except Exception:  # the broker is away: report nothing rather than fail the sweep
        logger.warning("queue depth: the broker did not answer", exc_info=True)
    return {}
