"""Where a warm pool's clusters run: the one seam between the pools' bookkeeping, which is the
same for every kind of compute target (``jobs/pools.py``: shapes, configuration, the claim, the
yield; ``jobs/pool_upkeep.py``: filling, stopping, reconciling), and what differs by kind.

* ``local``: a warm cluster is a sandboxed Ray cluster on this host (``LocalRayLauncher``); its
  room is the host's, under the host's admission lock.
* ``kuberay``: a warm cluster is a RayCluster in the pool's namespace, labelled with its pool and
  its row, with its own token Secret (``KubeRayLauncher.start_warm``); a job of its shape runs on
  it as a RayJob whose ``clusterSelector`` names it (``bind_warm``), and it is deleted after
  that attempt. Its room is the organisation's capacity (and its GPU flavor's count on the
  target), under the organisation's admission lock.

A pool target answers: the target's resolved config (None when the target no longer is of the
pool's kind), whose admission lock guards its room and the room check a fill takes under it,
the request a warm cluster is started from, the start itself, the shape key of an attempt's
request (None: it can take no warm cluster), and the warm clusters found on the target (the
sweep stops those no row accounts for).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from django.conf import settings
from django.db.models import Sum

from config.errors import InvalidInput
from quotas import selectors as quota_selectors
from quotas.models import RESOURCES, OrgQuota
from workspaces.models import ComputeTarget, ComputeTargetKind, Organization, Workspace

from . import spec as job_spec
from .launchers import launcher_for
from .launchers.base import LaunchError, LaunchRequest
from .local_host import sandbox_footprint
from .models import WARM_HOLDING, WarmCluster, WarmPool

WARM_PREFIX = "warm-"  # the submission id a warm cluster's handle names until it is claimed
# A warm cluster is started for no job: nothing is ever submitted with this entrypoint.
WARM_ENTRYPOINT = "true"
EPSILON = 1e-9


class PoolTarget(Protocol):
    kind: str

    def config(self, pool: WarmPool) -> dict[str, Any] | None: ...

    def place(
        self,
        organization: Organization,
        config: dict[str, Any],
        shape: dict[str, Any],
        *,
        workspace: str,
        gpu_flavor: str,
    ) -> dict[str, Any]: ...

    # Whose admission lock guards its room: the shared host's, or the pool's organisation's.
    room_of_host: bool

    def has_room(self, pool: WarmPool) -> bool: ...

    def request(self, cluster: WarmCluster, config: dict[str, Any]) -> LaunchRequest: ...

    def start(self, launcher, request: LaunchRequest, abandon) -> dict[str, Any]: ...

    def shape_of(self, request: LaunchRequest) -> str | None: ...

    def leftovers(self, cluster: WarmCluster) -> list[dict[str, Any]]: ...

    def found(self) -> list[dict[str, Any]]: ...

    def stop_found(self, handle: dict[str, Any]) -> None: ...


def target_of(pool: WarmPool) -> PoolTarget:
    return TARGETS[pool.kind]


def launcher_of(pool: WarmPool, config: dict[str, Any] | None = None):
    """A launcher for the pool's target (``config``: its resolved config, when known)."""
    if config is None:
        config = target_of(pool).config(pool) or {}
    return launcher_for(pool.kind, config)


def holdings(clusters) -> dict[str, float]:
    """What ``clusters`` (a queryset of warm clusters) hold that no reservation covers."""
    held = clusters.filter(state__in=WARM_HOLDING).aggregate(
        **{name: Sum(name) for name in RESOURCES}
    )
    return {name: held[name] or 0.0 for name in RESOURCES}


def _fits(capacity: dict[str, float | None], *amounts: dict[str, float]) -> bool:
    for name, cap in capacity.items():
        if cap is not None and sum(a.get(name, 0.0) for a in amounts) > cap + EPSILON:
            return False
    return True


def _warm_name(cluster: WarmCluster) -> str:
    return f"manta-warm-{cluster.pk}"


# --- shapes of local clusters ----------------------------------------------------------------


def _node(role: str, node: dict[str, Any]) -> list[Any]:
    resources = sorted((k, float(v)) for k, v in (node.get("resources") or {}).items())
    return [
        role,
        float(node.get("cpu") or 0),
        float(node.get("memory_gb") or 0),
        int(node.get("gpu") or 0),
        job_spec.node_disk_gb(node),
        resources,
    ]


def shape_key(spec: dict[str, Any], config: dict[str, Any]) -> str:
    """What decides how a cluster's nodes are started and sandboxed: the image, each node's
    CPUs, memory, GPUs, disk and custom resources (the head, then every worker replica in
    order; group names do not matter), and the target's object store size."""
    nodes = [_node("head", spec.get("head") or {})]
    for group in spec.get("worker_groups") or []:
        nodes += [_node("worker", group)] * int(group.get("replicas", 1))
    shape = {
        "image": spec.get("image", ""),
        "nodes": nodes,
        "object_store": (config or {}).get("object_store_memory_bytes"),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def footprint(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, float]:
    """What one cluster of ``spec`` holds of the host: what admission reserves for a job of
    that shape there (``jobs.services.requested_for``, the same arithmetic)."""
    return {**job_spec.requested_resources(spec), **(sandbox_footprint(spec, config) or {})}


def warm_spec(pool: WarmPool) -> dict[str, Any]:
    """The spec a pool's clusters are started from."""
    return {**pool.spec, "entrypoint": WARM_ENTRYPOINT}


def local_target_config(organization_id: int, target_name: str) -> dict[str, Any] | None:
    """The resolved config of the organisation's target ``target_name`` when it runs on this
    host (None when it does not)."""
    from .launch_requests import local_defaults

    target = ComputeTarget.objects.filter(organization_id=organization_id, name=target_name).first()
    if target is None:
        return local_defaults({}) if target_name == ComputeTargetKind.LOCAL else None
    return local_defaults(dict(target.config)) if target.kind == ComputeTargetKind.LOCAL else None


# --- local -----------------------------------------------------------------------------------


class LocalPoolTarget:
    kind = ComputeTargetKind.LOCAL
    room_of_host = True

    def config(self, pool: WarmPool) -> dict[str, Any] | None:
        return local_target_config(pool.organization_id, pool.target_name)

    def place(self, organization, config, shape, *, workspace, gpu_flavor) -> dict[str, Any]:
        for field, value in (("workspace", workspace), ("gpu_flavor", gpu_flavor)):
            if value:
                raise InvalidInput.on(field, "only a kuberay target's pool has one")
        return {"shape_key": shape_key(shape, config), "footprint": footprint(shape, config)}

    def has_room(self, pool: WarmPool) -> bool:
        """The host's reservations, every local pool's holdings and one more cluster of
        ``pool`` fit the host's capacity."""
        from .local_host import HOST
        from .local_host import capacity as host_capacity

        reserved = (
            quota_selectors.active_reservations()
            .filter(host=HOST)
            .aggregate(**{name: Sum(name) for name in RESOURCES})
        )
        reserved = {name: reserved[name] or 0.0 for name in RESOURCES}
        held = holdings(WarmCluster.objects.filter(pool__kind=self.kind))
        one = {name: getattr(pool, name) for name in RESOURCES}
        capacity = {name: cap for name, cap in host_capacity().items() if name in RESOURCES}
        return _fits(capacity, reserved, held, one)

    def request(self, cluster: WarmCluster, config: dict[str, Any]) -> LaunchRequest:
        return LaunchRequest(
            submission_id=f"{WARM_PREFIX}{cluster.pk}",
            cluster_name=_warm_name(cluster),
            spec=warm_spec(cluster.pool),
            labels={},
            target_config=config,
        )

    def start(self, launcher, request: LaunchRequest, abandon) -> dict[str, Any]:
        return launcher.start_cluster(request, abandon=abandon)

    def shape_of(self, request: LaunchRequest) -> str | None:
        return shape_key(request.spec, request.target_config)

    def leftovers(self, cluster: WarmCluster) -> list[dict[str, Any]]:
        """A start killed before its row got the handle: found by its dir's handle.json."""
        mine = f"{WARM_PREFIX}{cluster.pk}"
        return [found for found in self.found() if found.get("submission_id") == mine]

    def found(self) -> list[dict[str, Any]]:
        handles = launcher_for(self.kind, {}).find_clusters(
            {"work_dir": settings.MANTA_LOCAL_RAY_DIR}
        )
        return [h for h in handles if str(h.get("submission_id", "")).startswith(WARM_PREFIX)]

    def stop_found(self, handle: dict[str, Any]) -> None:
        launcher_for(self.kind, {}).stop(handle)


# --- kuberay ---------------------------------------------------------------------------------


class KubeRayPoolTarget:
    kind = ComputeTargetKind.KUBERAY
    room_of_host = False

    def config(self, pool: WarmPool) -> dict[str, Any] | None:
        from .launch_requests import resolve_named

        target = resolve_named(pool.organization_id, pool.target_name)
        return target.config if target is not None and target.kind == self.kind else None

    def place(self, organization, config, shape, *, workspace, gpu_flavor) -> dict[str, Any]:
        """The pool's namespace (``namespace_pattern`` with the org's slug and ``workspace``'s)
        and flavor, checked as a launch would check them; its key is the RayCluster a cold
        start of its shape would create there."""
        from .launchers.kuberay.manifest import LABEL_ORG, LABEL_WORKSPACE, namespace_for

        if (
            workspace
            and not Workspace.objects.filter(organization=organization, slug=workspace).exists()
        ):
            raise InvalidInput.on("workspace", f"{workspace!r} is not a workspace of this org")
        declared = config.get("gpu_flavors") or {}
        if gpu_flavor and gpu_flavor not in declared:
            raise InvalidInput.on("gpu_flavor", f"the target declares no flavor {gpu_flavor!r}")
        labels = {LABEL_ORG: organization.slug, LABEL_WORKSPACE: workspace}
        request = LaunchRequest(
            submission_id=WARM_PREFIX,
            cluster_name="manta-warm",
            spec={**shape, "entrypoint": WARM_ENTRYPOINT},
            labels=labels,
            target_config=config,
            gpu_flavor=gpu_flavor,
        )
        try:
            namespace = namespace_for(request)
        except LaunchError as exc:
            raise InvalidInput.on("workspace", str(exc)) from exc
        try:
            key = self.shape_of(request, strict=True)
        except LaunchError as exc:
            field = "gpu_flavor" if "flavor" in str(exc) else "spec"
            raise InvalidInput.on(field, str(exc)) from exc
        return {
            "shape_key": key,
            "footprint": job_spec.requested_resources(shape),
            "namespace": namespace,
            "gpu_flavor": gpu_flavor,
        }

    def has_room(self, pool: WarmPool) -> bool:
        """The organisation's reservations, its kuberay pools' holdings and one more cluster
        of ``pool`` fit its capacity; and, for a pool of a GPU flavor, what the target's jobs
        and pools hold of that flavor plus its GPUs fit the count the target declares."""
        org = pool.organization_id
        quota = OrgQuota.objects.filter(organization_id=org).first()
        capacity = {name: getattr(quota, name) if quota else None for name in RESOURCES}
        reservations = quota_selectors.active_reservations().filter(organization_id=org)
        reserved = reservations.aggregate(**{name: Sum(name) for name in RESOURCES})
        reserved = {name: reserved[name] or 0.0 for name in RESOURCES}
        mine = WarmCluster.objects.filter(pool__organization_id=org, pool__kind=self.kind)
        one = {name: getattr(pool, name) for name in RESOURCES}
        if not _fits(capacity, reserved, holdings(mine), one):
            return False
        if not (pool.gpu_flavor and pool.gpu):
            return True
        declared = ((self.config(pool) or {}).get("gpu_flavors") or {}).get(pool.gpu_flavor)
        count = float(declared["count"]) if declared else 0.0
        flavor_jobs = reservations.filter(
            gpu_flavor=pool.gpu_flavor, workspace__compute_target=pool.target_name
        ).aggregate(gpu=Sum("gpu"))["gpu"]
        flavor_pools = holdings(
            mine.filter(pool__target_name=pool.target_name, pool__gpu_flavor=pool.gpu_flavor)
        )["gpu"]
        return (flavor_jobs or 0.0) + flavor_pools + pool.gpu <= count + EPSILON

    def request(self, cluster: WarmCluster, config: dict[str, Any]) -> LaunchRequest:
        from .launchers.kuberay.manifest import LABEL_ORG, LABEL_POOL, LABEL_WARM

        pool = cluster.pool
        return LaunchRequest(
            submission_id=f"{WARM_PREFIX}{cluster.pk}",
            cluster_name=_warm_name(cluster),
            spec=warm_spec(pool),
            labels={
                LABEL_ORG: pool.organization.slug,
                LABEL_POOL: str(pool.pk),
                LABEL_WARM: str(cluster.pk),
            },
            # The namespace the pool was made for, whatever the pattern says now: a job's
            # RayJob selects a cluster in its own namespace only (and its shape key says so).
            target_config={**config, "namespace_pattern": pool.namespace},
            gpu_flavor=pool.gpu_flavor,
        )

    def start(self, launcher, request: LaunchRequest, abandon) -> dict[str, Any]:
        return launcher.start_warm(request)  # one API call: KubeRay brings the cluster up

    def shape_of(self, request: LaunchRequest, *, strict: bool = False) -> str | None:
        """The digest of the RayCluster a cold start of ``request`` would create, and where.
        None for a job that asks KubeRay for retries (it refuses them on a selected cluster)
        or that a cold start would refuse as well (``strict``: raise LaunchError then)."""
        from .launchers.kuberay.manifest import cluster_shape

        if request.spec.get("max_retries"):
            return None
        try:
            shape = cluster_shape(request)
        except LaunchError:
            if strict:
                raise
            return None
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()

    def leftovers(self, cluster: WarmCluster) -> list[dict[str, Any]]:
        """A start killed before its row got the handle: its RayCluster is named by its row."""
        pool = cluster.pool
        return [
            {
                "namespace": pool.namespace,
                "ray_cluster": _warm_name(cluster),
                "submission_id": f"{WARM_PREFIX}{cluster.pk}",
            }
        ]

    def found(self) -> list[dict[str, Any]]:
        """The RayClusters that carry a kuberay pool's labels, in its namespace (a namespaced
        list: the rights a tenant's kubeconfig has). A target that cannot be reached is
        skipped until the next sweep."""
        from .launchers.kuberay.manifest import LABEL_POOL, LABEL_WARM, MANAGED_BY

        handles = []
        for pool in WarmPool.objects.filter(kind=self.kind).select_related("organization"):
            config = self.config(pool)
            if config is None:
                continue
            launcher = launcher_for(self.kind, config)
            try:
                found = launcher.find_warm(pool.namespace, {**MANAGED_BY, LABEL_POOL: str(pool.pk)})
            except LaunchError:
                continue
            finally:
                launcher.close()
            for handle in found:
                row = handle.pop("labels").get(LABEL_WARM, "")
                handles.append({**handle, "submission_id": f"{WARM_PREFIX}{row}", "pool": pool.pk})
        return handles

    def stop_found(self, handle: dict[str, Any]) -> None:
        pool = WarmPool.objects.get(pk=handle["pool"])
        launcher = launcher_of(pool)
        try:
            launcher.stop(handle)
        finally:
            launcher.close()


TARGETS: dict[str, PoolTarget] = {
    ComputeTargetKind.LOCAL: LocalPoolTarget(),
    ComputeTargetKind.KUBERAY: KubeRayPoolTarget(),
}
