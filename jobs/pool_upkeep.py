"""Keeping warm pools (``jobs/pools.py``) true to their rows: filling them, handing a warm cluster
to an attempt, stopping retired clusters, and the sweep's reconcile of rows with processes (a
local target's) or with the RayClusters the API server lists (a kuberay target's). What differs
by kind of target is behind ``jobs/pool_targets.py``; everything here is the same for both.

Every cluster has its row before its first process starts (``starting``, with the pid and start
time of the worker starting it), and what it is started as names ``warm-<row id>`` from the
start (a local cluster's ``handle.json``, a RayCluster's name and labels): whatever was killed
when, the sweep finds each cluster from its row or on its target and stops what no live row
accounts for.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from config import secrets
from quotas.models import RESOURCES

from . import dispatch
from .launchers import launcher_for
from .launchers.base import LaunchAbandoned, LaunchError, LaunchRequest
from .launchers.local.sandbox import process_start_time
from .models import ATTEMPT_ACTIVE, JobAttempt, WarmCluster, WarmClusterState, WarmPool
from .pool_targets import TARGETS, WARM_PREFIX, launcher_of, target_of
from .pools import claimed_by, handle_of, pool_claim, pool_for

__all__ = ["WARM_PREFIX", "pool_fill", "pool_stop", "pools_reconcile", "warm_take"]

logger = logging.getLogger(__name__)
S = WarmClusterState


# --- filling ---------------------------------------------------------------------------------


def pool_fill(pool_id: int) -> int:
    """Start clusters, one after the other, until the pool holds ``size`` starting or idle ones
    or the host has no room for another. Returns how many started."""
    started = 0
    while True:
        cluster = _take_slot(pool_id)
        if cluster is None:
            return started
        if _start(cluster):
            started += 1
        else:
            return started  # a failed start is not retried at once: the next upkeep will


def _take_slot(pool_id: int) -> WarmCluster | None:
    """A ``starting`` row for one more cluster of the pool, when it lacks one and its target
    has room: under the admission lock of that room (the host's, or the organisation's), so a
    pool and an admission pass never both take the same room."""
    from .admission import lock_admission, lock_host

    found = WarmPool.objects.filter(pk=pool_id).values_list("kind", "organization_id").first()
    if found is None:
        return None
    target = TARGETS[found[0]]
    with transaction.atomic():
        if target.room_of_host:
            lock_host()
        else:
            lock_admission(found[1])
        pool = WarmPool.objects.select_for_update().filter(pk=pool_id).first()
        if pool is None or pool.size == 0:
            return None
        live = pool.clusters.filter(state__in=(S.STARTING, S.IDLE)).count()
        if live >= pool.size or target.config(pool) is None:
            return None
        if not target.has_room(pool):
            logger.info("warm pool %s waits: its target has no room for another cluster", pool.pk)
            return None
        pid = os.getpid()
        return WarmCluster.objects.create(
            pool=pool,
            state=S.STARTING,
            starter_pid=pid,
            starter_start=process_start_time(pid),
            **{name: getattr(pool, name) for name in RESOURCES},
        )


def _start(cluster: WarmCluster) -> bool:
    """Bring the cluster of a ``starting`` row up and make it ``idle``."""
    pool = cluster.pool
    target = target_of(pool)
    config = target.config(pool) or {}
    request = target.request(cluster, config)
    launcher = launcher_of(pool, config)
    starting = WarmCluster.objects.filter(pk=cluster.pk, state=S.STARTING)
    try:
        handle = target.start(
            launcher,
            request,
            abandon=lambda: "" if starting.exists() else "the warm cluster was retired",
        )
    except (LaunchAbandoned, LaunchError) as exc:
        logger.warning("warm cluster %s of pool %s did not start: %s", cluster.pk, pool.pk, exc)
        _mark_stopped(cluster.pk, "start_failed", states=(S.STARTING, S.RETIRING))
        return False
    ready = starting.update(
        state=S.IDLE, handle_encrypted=secrets.encrypt_json(handle), ready_at=timezone.now()
    )
    if not ready:  # retired while it came up
        launcher.stop(handle)
        _mark_stopped(cluster.pk, "retired", states=(S.RETIRING,))
        return False
    logger.info("warm cluster %s of pool %s is idle", cluster.pk, pool.pk)
    return True


def _mark_stopped(pk: int, reason: str, *, states) -> None:
    """The row of a cluster that is gone, with why (the first reason given is kept)."""
    now = timezone.now()
    WarmCluster.objects.filter(pk=pk, state__in=states, stop_reason="").update(
        state=S.STOPPED, stopped_at=now, stop_reason=reason
    )
    WarmCluster.objects.filter(pk=pk, state__in=states).update(state=S.STOPPED, stopped_at=now)


# --- the claim, at launch --------------------------------------------------------------------


def warm_take(
    attempt: JobAttempt, request: LaunchRequest, kind: str
) -> tuple[dict[str, Any], WarmCluster] | None:
    """A running warm cluster of the attempt's shape on its target (of ``kind``), bound to the
    attempt (its handle), or None: no pool of its shape, or none idle (the caller starts a
    cluster cold). A launch retried after a crash takes up the cluster it had claimed."""
    if kind not in TARGETS:
        return None
    launcher = launcher_for(kind, request.target_config)
    cluster = claimed_by(attempt)
    pool = None
    for _ in range(3):  # a claimed cluster found dead is stopped and another one tried
        if cluster is None:
            pool = pool or pool_for(attempt, request, kind)
            if pool is None:
                return None
            cluster = pool_claim(pool=pool, attempt=attempt)
            if cluster is None:
                return None
        handle = handle_of(cluster)
        bound = launcher.bind_warm(handle, request) if handle else None
        if bound is not None:
            bound["warm_cluster"] = cluster.pk
            return bound, cluster
        logger.warning("warm cluster %s was not running; stopping it", cluster.pk)
        if handle:
            launcher.stop(handle)
        _mark_stopped(cluster.pk, "lost", states=(S.CLAIMED,))
        cluster = None
    return None


# --- stopping --------------------------------------------------------------------------------


def pool_stop(cluster_ids: list[int]) -> int:
    """Stop the retired clusters among ``cluster_ids`` (idempotent). A retired cluster still
    being started is left to its starter, which sees it retired and stops. Returns how many
    were stopped."""
    stopped = 0
    for cluster in WarmCluster.objects.filter(pk__in=cluster_ids, state=S.RETIRING):
        handle = handle_of(cluster)
        if handle is None and _starter_alive(cluster):
            continue
        _stop_cluster(cluster, handle)
        _mark_stopped(cluster.pk, "retired", states=(S.RETIRING,))
        stopped += 1
    return stopped


def _stop_cluster(cluster: WarmCluster, handle: dict[str, Any] | None) -> None:
    """Stop the cluster (idempotent). A target that cannot be reached now is left: what is
    still there is a stray for a later sweep (its row stopped, its labels or dir remain)."""
    target = target_of(cluster.pool)
    launcher = launcher_of(cluster.pool)
    try:
        if handle is not None:
            launcher.stop(handle)
        for found in target.leftovers(cluster):  # a start killed before its row got the handle
            launcher.stop(found)
    except LaunchError as exc:
        logger.warning("warm cluster %s not stopped yet: %s", cluster.pk, exc)


def _starter_alive(cluster: WarmCluster) -> bool:
    pid = cluster.starter_pid
    return bool(pid) and process_start_time(pid) == cluster.starter_start


def _retire(cluster: WarmCluster, reason: str) -> bool:
    return bool(
        WarmCluster.objects.filter(pk=cluster.pk, state=cluster.state).update(
            state=S.RETIRING, stop_reason=reason
        )
    )


# --- the sweep -------------------------------------------------------------------------------


def pools_reconcile() -> dict[str, int]:
    """Make the clusters match their rows, and the rows the processes (the sweep runs it):

    * a ``starting`` row whose worker is gone (pid and start time) is retired;
    * an ``idle`` cluster past its pool's idle timeout, or whose processes are gone, is retired;
    * a pool holding more than its size retires its newest idle clusters;
    * a ``claimed`` cluster whose attempt has been torn down (or ended long ago) is stopped
      (idempotent: the attempt's teardown stopped it already, unless the attempt never stored
      its handle);
    * every retired cluster is stopped, and every warm cluster dir no live row accounts for;
    * pools below their size are filled (in a task).
    """
    now = timezone.now()
    counts = dict.fromkeys(("retired", "stopped", "strays", "fills"), 0)
    in_use = WarmCluster.objects.exclude(state=S.STOPPED).exists()
    if not in_use and not WarmPool.objects.filter(size__gt=0).exists():
        return counts  # no pool in use: one query a sweep, and no look at the work dir
    for cluster in WarmCluster.objects.filter(state=S.STARTING):
        if not _starter_alive(cluster):
            counts["retired"] += _retire(cluster, "starter_lost")
    launchers: dict[int, Any] = {}
    for cluster in WarmCluster.objects.filter(state=S.IDLE).select_related("pool"):
        timeout = dt.timedelta(seconds=cluster.pool.idle_timeout_seconds)
        handle = handle_of(cluster)
        if cluster.ready_at and cluster.ready_at < now - timeout:
            counts["retired"] += _retire(cluster, "idle_timeout")
        elif handle is None or not _alive(cluster, handle, launchers):
            counts["retired"] += _retire(cluster, "lost")
    for pool in WarmPool.objects.all():
        idle = list(pool.clusters.filter(state=S.IDLE).order_by("-ready_at", "-id"))
        extra = len(idle) + pool.clusters.filter(state=S.STARTING).count() - pool.size
        for cluster in idle[: max(0, extra)]:
            counts["retired"] += _retire(cluster, "pool_shrunk")
    stale = now - dt.timedelta(seconds=settings.MANTA_HEARTBEAT_STALE_SECONDS)
    used = WarmCluster.objects.filter(state=S.CLAIMED).filter(
        Q(attempt__isnull=True)
        | Q(attempt__torn_down_at__isnull=False)
        | (~Q(attempt__state__in=ATTEMPT_ACTIVE) & Q(attempt__finished_at__lt=stale))
    )
    for cluster in used:
        _stop_cluster(cluster, handle_of(cluster))
        _mark_stopped(cluster.pk, "used", states=(S.CLAIMED,))
    retiring = list(WarmCluster.objects.filter(state=S.RETIRING).values_list("pk", flat=True))
    counts["stopped"] = pool_stop(retiring)
    counts["strays"] = _stop_strays()
    for pool in WarmPool.objects.filter(size__gt=0):
        if pool.clusters.filter(state__in=(S.STARTING, S.IDLE)).count() < pool.size:
            dispatch.pool_fill(pool.pk)
            counts["fills"] += 1
    return counts


def _alive(cluster: WarmCluster, handle: dict[str, Any], launchers: dict[int, Any]) -> bool:
    """The cluster's processes (or its RayCluster) are still there; a target that cannot say
    (unreachable) leaves it be until the next sweep."""
    if cluster.pool_id not in launchers:
        launchers[cluster.pool_id] = launcher_of(cluster.pool)
    try:
        return launchers[cluster.pool_id].is_alive(handle)
    except LaunchError as exc:
        logger.warning("warm cluster %s: cannot tell whether it runs: %s", cluster.pk, exc)
        return True


def _stop_strays() -> int:
    """Stop the warm clusters found on their targets that no live row accounts for (a row
    stopped while a killed start's processes lived on, a row that was never committed, a
    RayCluster with a pool's labels that no row names)."""
    strays = 0
    for target in TARGETS.values():
        ids = {}
        for handle in target.found():
            number = str(handle["submission_id"])[len(WARM_PREFIX) :]
            if number.isdigit():
                ids.setdefault(int(number), []).append(handle)
        live = set(
            WarmCluster.objects.filter(
                pk__in=ids, state__in=(S.STARTING, S.IDLE, S.CLAIMED, S.RETIRING)
            ).values_list("pk", flat=True)
        )
        for pk, handles in ids.items():
            if pk in live:
                continue
            for handle in handles:
                logger.warning("stopping warm cluster %s: no live row", _name(handle))
                target.stop_found(handle)
                strays += 1
    return strays


def _name(handle: dict[str, Any]) -> str:
    return str(handle.get("cluster_name") or handle.get("ray_cluster") or "")
