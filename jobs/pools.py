"""Warm pools: clusters of one shape started ahead of need, so that an attempt whose job has that
shape skips Ray's node start-up. Below, the ``local`` target; a ``kuberay`` target's pools keep
RayClusters instead, through the same bookkeeping (``jobs/pool_targets.py`` is the seam).

The warm unit is a whole cluster (head and workers), not a node: a local cluster's nodes share
one sandbox (one uid, one network namespace that holds every Ray port, one cgroup sized for all
of them) and one Ray token, so a node cannot join a cluster started in another sandbox. What a
cluster can be started with before its tenant is known is exactly that: a fresh sandbox (fresh
uid, namespaces, cgroups, disk) and ``ray start`` with a fresh token; the job's runtime_env and
code arrive with the submission. A job takes a warm cluster only when its shape (image, and
every node's CPUs, GPUs, memory, disk and custom resources, in order) is the pool's; otherwise,
or when the pool is empty, it starts cold.

Promises:

* A warm cluster is handed to one attempt at most: the claim is one ``UPDATE … WHERE
  state='idle'`` on a row locked with SKIP LOCKED, and it is torn down with that attempt (the
  attempt's own teardown: its handle is the attempt's). No cluster is reused.
* Pools never over-commit the host: a cluster that is starting, idle or being stopped holds its
  footprint (what a job of its shape reserves) on the host, and a new one is started only while
  the host's reservations and the pools' holdings leave room for it (under admission's host
  lock). Admission counts only reservations, and when what it admits leaves the host short,
  idle (then starting) warm clusters are retired to make room, in the same transaction.
* The rows are the truth (``jobs/pool_upkeep.py`` reconciles them with the processes).

Here: shapes, the pools' configuration (services for the API and the admin), the claim, and the
yield to admission. ``pool_upkeep.py``: filling, stopping and reconciling. ``pool_targets.py``:
what differs by kind of target (where a cluster runs, its room, its start).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone
from rest_framework import serializers

from audit import services as audit
from audit.context import Actor
from config import secrets
from config.errors import InvalidInput
from quotas.models import RESOURCES
from workspaces.models import ComputeTargetKind, Organization

from . import dispatch, metrics_events, pool_targets
from . import spec as job_spec
from .launchers.base import LaunchRequest
from .models import Job, JobAttempt, WarmCluster, WarmClusterState, WarmPool
from .pool_targets import (  # noqa: F401  (the shapes are the pools' as much as the targets')
    WARM_ENTRYPOINT,
    footprint,
    local_target_config,
    shape_key,
    warm_spec,
)

logger = logging.getLogger(__name__)

POOL_FIELDS = ["size", "idle_timeout_seconds"]
MAX_POOL_SIZE = 64
SHAPE_FIELDS = ("image", "head", "worker_groups")


# --- configuration (org admins, through the API and the admin) -------------------------------


def _validate_sizes(data: dict[str, Any]) -> None:
    size = data.get("size")
    if size is not None and not (isinstance(size, int) and 0 <= size <= MAX_POOL_SIZE):
        raise InvalidInput.on("size", f"must be a whole number from 0 to {MAX_POOL_SIZE}")
    timeout = data.get("idle_timeout_seconds")
    if timeout is not None and not (isinstance(timeout, int) and 10 <= timeout <= 7 * 86400):
        raise InvalidInput.on(
            "idle_timeout_seconds", "must be a whole number of seconds from 10 to 604800"
        )


def _validate_shape(organization: Organization, shape: Any) -> dict[str, Any]:
    if not isinstance(shape, dict):
        raise InvalidInput.on("spec", "must be an object with image, head and worker_groups")
    unknown = sorted(set(shape) - set(SHAPE_FIELDS))
    if unknown:
        raise InvalidInput.on(
            f"spec.{unknown[0]}", "a pool's shape has only image, head and worker_groups"
        )
    try:
        spec = job_spec.validate_spec(
            {**shape, "entrypoint": WARM_ENTRYPOINT}, organization=organization
        )
    except serializers.ValidationError as exc:
        from config.errors import invalid_from_serializer

        raise invalid_from_serializer(exc, prefix="spec") from exc
    return {key: spec[key] for key in SHAPE_FIELDS}


def pool_target_config(organization_id: int, target_name: str) -> tuple[str, dict] | None:
    """The kind and resolved config of the organisation's target ``target_name`` when it can
    have warm pools (a local target, or a kuberay one); None when it cannot."""
    config = local_target_config(organization_id, target_name)
    if config is not None:
        return ComputeTargetKind.LOCAL, config
    from .launch_requests import resolve_named

    target = resolve_named(organization_id, target_name)
    if target is None or target.kind not in pool_targets.TARGETS:
        return None
    return target.kind, target.config


@transaction.atomic
def pool_create(
    *,
    actor: Actor,
    organization: Organization,
    target_name: str,
    spec: Any,
    size: int = 0,
    idle_timeout_seconds: int = 600,
    workspace: str = "",
    gpu_flavor: str = "",
) -> WarmPool:
    """A warm pool of ``spec``'s shape on the organisation's local or kuberay target
    ``target_name`` (a kuberay pool lives in the namespace of ``workspace``, as the target's
    namespace_pattern says, and its GPU pods on the nodes of ``gpu_flavor``)."""
    _validate_sizes({"size": size, "idle_timeout_seconds": idle_timeout_seconds})
    found = pool_target_config(organization.pk, target_name)
    if found is None:
        raise InvalidInput.on(
            "target_name",
            f"{target_name!r} is not a local or kuberay compute target of this organisation",
        )
    kind, config = found
    shape = _validate_shape(organization, spec)
    placed = pool_targets.TARGETS[kind].place(
        organization, config, shape, workspace=workspace, gpu_flavor=gpu_flavor
    )
    key = placed["shape_key"]
    if WarmPool.objects.filter(
        organization=organization, target_name=target_name, shape_key=key
    ).exists():
        raise InvalidInput.on("spec", "this target already has a pool of this shape")
    held = placed["footprint"]
    pool = WarmPool.objects.create(
        organization=organization,
        target_name=target_name,
        kind=kind,
        namespace=placed.get("namespace", ""),
        gpu_flavor=placed.get("gpu_flavor", ""),
        spec=shape,
        shape_key=key,
        size=size,
        idle_timeout_seconds=idle_timeout_seconds,
        **{name: held.get(name, 0.0) for name in RESOURCES},
    )
    audit.record(
        actor=actor,
        action="warm_pool.create",
        target=pool,
        organization=organization,
        changes={"target_name": [None, target_name], "size": [None, size]},
    )
    transaction.on_commit(lambda: dispatch.pool_fill(pool.pk), robust=True)
    return pool


@transaction.atomic
def pool_update(*, actor: Actor, pool: WarmPool, data: dict[str, Any]) -> WarmPool:
    """Resize a pool or change its idle timeout; a smaller pool stops its extra idle clusters
    (at the next upkeep), a larger one fills in the background."""
    _validate_sizes(data)
    pool = WarmPool.objects.select_for_update().get(pk=pool.pk)
    audit.model_update(
        instance=pool,
        fields=POOL_FIELDS,
        data=data,
        actor=actor,
        action="warm_pool.update",
        full_clean=False,
        target_repr=str(pool),
        organization=pool.organization,
    )
    transaction.on_commit(lambda: dispatch.pool_fill(pool.pk), robust=True)
    return pool


# --- the claim -------------------------------------------------------------------------------


def pool_for(attempt: JobAttempt, request: LaunchRequest, kind: str) -> WarmPool | None:
    """The pool of the attempt's target (of ``kind``) whose shape is its job's (None: no such
    pool, or a job that can take no warm cluster)."""
    job = attempt.job
    key = pool_targets.TARGETS[kind].shape_of(request)
    if key is None:
        return None
    return (
        WarmPool.objects.select_related("organization")
        .filter(
            organization_id=job.organization_id,
            target_name=job.workspace.compute_target,
            shape_key=key,
        )
        .first()
    )


def claimed_by(attempt: JobAttempt) -> WarmCluster | None:
    """The warm cluster this attempt claimed, if it claimed one and has not stored its handle
    (a launch killed between the two): the launch retried takes it up again."""
    return WarmCluster.objects.filter(attempt=attempt, state=WarmClusterState.CLAIMED).first()


def pool_claim(*, pool: WarmPool, attempt: JobAttempt) -> WarmCluster | None:
    """Take one idle cluster of ``pool`` for ``attempt`` (the oldest ready), or None.

    The row is locked with SKIP LOCKED, then moved from idle with a conditional UPDATE: two
    attempts claiming at once never get the same cluster, and neither waits for the other.
    """
    with transaction.atomic():
        row = (
            WarmCluster.objects.select_for_update(skip_locked=True)
            .filter(pool=pool, state=WarmClusterState.IDLE)
            .order_by("ready_at", "id")
            .first()
        )
        now = timezone.now()
        if row is None or not (
            WarmCluster.objects.filter(pk=row.pk, state=WarmClusterState.IDLE).update(
                state=WarmClusterState.CLAIMED, attempt=attempt, claimed_at=now
            )
        ):
            WarmPool.objects.filter(pk=pool.pk).update(misses=F("misses") + 1)
            transaction.on_commit(lambda: metrics_events.warm_claim(pool, hit=False))
            return None
        WarmPool.objects.filter(pk=pool.pk).update(hits=F("hits") + 1)
        transaction.on_commit(lambda: metrics_events.warm_claim(pool, hit=True))
        transaction.on_commit(lambda: dispatch.pool_fill(pool.pk), robust=True)  # refill
    row.state, row.attempt, row.claimed_at = WarmClusterState.CLAIMED, attempt, now
    return row


def handle_of(cluster: WarmCluster) -> dict[str, Any] | None:
    return secrets.decrypt_json(cluster.handle_encrypted) if cluster.handle_encrypted else None


# --- the host --------------------------------------------------------------------------------


def held_on_host() -> dict[str, float]:
    """What the pools' clusters hold of the host that no reservation covers."""
    return pool_targets.holdings(WarmCluster.objects.filter(pool__kind=ComputeTargetKind.LOCAL))


def _yieldable(scope, kept: dict[int, int]):
    """The clusters of ``scope`` that yield to admitted work: idle ones (the oldest first), then
    starting; but ``kept[pool]`` idle clusters of each pool, which admitted jobs of its shape
    will claim."""
    for state in (WarmClusterState.IDLE, WarmClusterState.STARTING):
        rows = scope.select_for_update(skip_locked=True).filter(state=state)
        for cluster in rows.order_by("created_at", "id"):
            if state == WarmClusterState.IDLE and kept.get(cluster.pool_id, 0) > 0:
                kept[cluster.pool_id] -= 1
                continue
            yield cluster


def _wanted(job_ids: list[int], gpu_flavors: dict[int, str]) -> dict[int, int]:
    """How many of ``job_ids`` (just admitted, with the GPU flavors chosen for them) each pool
    has the shape of: they will claim its idle clusters, so those are not the ones to stop."""
    from .launchers.kuberay.manifest import LABEL_ORG, LABEL_WORKSPACE

    wanted: dict[int, int] = {}
    configs: dict[tuple[int, str], tuple[str, dict] | None] = {}
    rows = Job.objects.filter(pk__in=job_ids).select_related("organization", "workspace")
    for job in rows:
        org_id, target = job.organization_id, job.workspace.compute_target
        if (org_id, target) not in configs:
            configs[org_id, target] = pool_target_config(org_id, target)
        if configs[org_id, target] is None:
            continue
        kind, config = configs[org_id, target]
        request = LaunchRequest(
            submission_id="",
            cluster_name="",
            spec=job.spec,
            labels={LABEL_ORG: job.organization.slug, LABEL_WORKSPACE: job.workspace.slug},
            target_config=config,
            gpu_flavor=gpu_flavors.get(job.pk, ""),
        )
        key = pool_targets.TARGETS[kind].shape_of(request)
        pool = (
            WarmPool.objects.filter(organization_id=org_id, target_name=target, shape_key=key)
            .values_list("pk", flat=True)
            .first()
        )
        if pool is not None:
            wanted[pool] = wanted.get(pool, 0) + 1
    return wanted


def pools_yield(
    *,
    reserved: dict[str, float],
    capacity: dict[str, float | None],
    admitted: list[int],
    organization_id: int | None = None,
    gpu_flavors: dict[int, str] | None = None,
) -> list[int]:
    """In admission's transaction, under its host lock: when the host's reservations (those it
    just made included) and the local pools' holdings are over its capacity, retire idle (then
    starting) warm clusters until they are not. An idle cluster that a job just ``admitted``
    will claim is kept (its room passes to that job's reservation, so it is not counted twice).
    Returns the ids retired; they are stopped after commit. A cluster locked by a claim in
    progress is skipped.

    With ``organization_id`` (under its admission lock), the same for its kuberay pools against
    its capacity: ``reserved`` is then what the organisation holds."""
    if organization_id is None:
        scope = WarmCluster.objects.filter(pool__kind=ComputeTargetKind.LOCAL)
    else:
        scope = WarmCluster.objects.filter(
            pool__kind=ComputeTargetKind.KUBERAY, pool__organization_id=organization_id
        )
    holding = scope.filter(state__in=(WarmClusterState.STARTING, WarmClusterState.IDLE))
    pools = holding.aggregate(**{name: Sum(name) for name in RESOURCES})
    over = {
        name: reserved.get(name, 0.0) + (pools[name] or 0.0) - cap
        for name, cap in capacity.items()
        if cap is not None and name in RESOURCES
    }
    if all(value <= 1e-9 for value in over.values()):
        return []
    kept = _wanted(admitted, gpu_flavors or {})
    for pool_id, count in kept.items():
        idle = holding.filter(pool_id=pool_id, state=WarmClusterState.IDLE)
        for cluster in idle.order_by("created_at", "id")[:count]:
            for name in over:  # its room is the admitted job's now
                over[name] -= getattr(cluster, name)
    retired = []
    for cluster in _yieldable(scope, dict(kept)):
        if all(value <= 1e-9 for value in over.values()):
            break
        if not any(over[name] > 1e-9 and getattr(cluster, name) > 0 for name in over):
            continue  # frees nothing the host is short of
        moved = WarmCluster.objects.filter(pk=cluster.pk, state=cluster.state).update(
            state=WarmClusterState.RETIRING, stop_reason="yielded"
        )
        if moved:
            retired.append(cluster.pk)
            for name in over:
                over[name] -= getattr(cluster, name)
    if retired:
        logger.info("warm clusters %s yield the host to admitted work", retired)
        transaction.on_commit(lambda: dispatch.pool_stop(retired), robust=True)
    return retired
