"""``LocalRayLauncher``: the launcher contract (``..base.Launcher``) over this package's parts.

It turns a spec into nodes (:meth:`LocalRayLauncher.plan`), asks ``startup`` to bring them up
(retrying a lost port race, adopting a complete cluster a crashed caller left), submits through
the Ray Jobs API, and answers status from the dashboard (or, where it cannot answer, from the
sandbox) and logs from the driver log the head writes on this host. See the package docstring
for what it promises.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import dashboard_http, ray_jobs
from ..base import RAY_FAILED, RAY_TERMINAL, LaunchError, LaunchRequest, LogPart, RayJobState
from . import disk
from .handles import KIND, discover_handles, sandbox_of, write_handle
from .isolation import (
    ENTERED_NAMESPACES,
    MODE_OFF,
    MODE_SANDBOX,
    NETWORK_LOOPBACK,
    NETWORK_NAT,
    SandboxSettings,
    egress_available,
    gb_to_bytes,
    host_support,
    sandbox_limits,
)
from .logs import driver_log_lines, driver_log_part, follow_driver_log
from .nodes import heal_workers, nodes_running
from .processes import DEFAULT_STOP_GRACE, ClusterProcesses, reap, teardown
from .sandbox import Sandbox
from .startup import Abandon, PortConflict, sandbox_nodes, start_cluster_once, wait_for_nodes

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

logger = logging.getLogger(__name__)

GIB = 1024**3
LOG_LIMIT = 2 * 1024**2  # the most logs() reads of a driver log, from its end
DEFAULT_START_TIMEOUT = 120.0
START_ATTEMPTS = 3  # a port taken between our check and Ray's bind costs one more attempt


class LocalRayLauncher:
    """Runs each attempt on its own ephemeral Ray cluster made of local processes."""

    kind = KIND

    def __init__(self) -> None:
        # Building a JobSubmissionClient costs two HTTP round trips; reuse them per cluster.
        self._clients: OrderedDict[tuple[str, str], JobSubmissionClient] = OrderedDict()
        self._clients_lock = threading.Lock()

    # -- the contract --------------------------------------------------------------------------

    def plan(self, request: LaunchRequest) -> dict[str, Any]:
        """The nodes and the submission start_cluster() and submit() would start. Raises
        LaunchError for a spec this launcher cannot run (e.g. fractional CPUs: ``ray start``
        takes whole numbers)."""
        spec = request.spec
        entrypoint = spec.get("entrypoint")
        if not entrypoint:
            raise LaunchError("The job spec has no entrypoint")
        head = spec.get("head") or {}
        nodes = [{"role": "head", "group": "head", **_node_resources(head, "head")}]
        for group in spec.get("worker_groups") or []:
            name = group.get("name") or "workers"
            replicas = _whole(group.get("replicas", 1), f"worker group {name!r} replicas")
            resources = _node_resources(group, f"worker group {name!r}")
            for index in range(replicas):
                nodes.append({"role": "worker", "group": name, "index": index, **resources})
        if request.gpu_flavor:
            nodes = [_of_flavor(node, request.gpu_flavor) for node in nodes]
        settings = SandboxSettings.from_config((request.target_config or {}).get("sandbox"))
        return {
            "kind": KIND,
            "cluster_name": request.cluster_name,
            "nodes": nodes,
            "isolation": _isolation_plan(settings, nodes, request.target_config or {}),
            "submission": {
                "submission_id": request.submission_id,
                "entrypoint": entrypoint,
                "runtime_env": ray_jobs.clean_runtime_env(spec.get("runtime_env")),
                "entrypoint_num_cpus": 0,
            },
        }

    def start_cluster(
        self, request: LaunchRequest, *, abandon: Callable[[], str] | None = None
    ) -> dict[str, Any]:
        """Start the head and all worker nodes and wait until every node is alive in Ray.

        ``abandon`` is asked, at most twice a second while nodes start, whether to stop: a
        non-empty answer (why) tears down what has started and raises LaunchAbandoned.

        Returns the handle. A complete, running cluster of the same submission_id under the
        same ``work_dir`` (left by a caller that died before storing its handle) is adopted
        instead of starting a second one. Raises LaunchError (after tearing down whatever had
        started) when a node dies during start-up or the cluster is not complete within the
        start timeout.
        """
        reap()
        nodes = self.plan(request)["nodes"]
        config = request.target_config or {}
        settings = SandboxSettings.from_config(config.get("sandbox"))
        if settings.mode == MODE_SANDBOX:
            problems = _host_support(settings)
            if problems:
                raise LaunchError(
                    "this host cannot isolate tenant jobs: "
                    + "; ".join(problems)
                    + ". Fix that, or set MANTA_LOCAL_ISOLATION=off (single-user mode)."
                )
        elif settings.mode != MODE_OFF:
            raise LaunchError(f"unknown isolation mode {settings.mode!r}")
        base_dir = config.get("work_dir") or tempfile.gettempdir()
        os.makedirs(base_dir, exist_ok=True)
        timeout = float(config.get("start_timeout_seconds") or DEFAULT_START_TIMEOUT)
        existing = self._adopt_cluster(request, len(nodes), base_dir, timeout)
        if existing is not None:
            return existing
        grace = float(config.get("stop_grace_seconds") or DEFAULT_STOP_GRACE)
        object_store = config.get("object_store_memory_bytes")
        last_error: LaunchError | None = None
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return start_cluster_once(
                    request,
                    nodes,
                    base_dir,
                    timeout,
                    grace,
                    object_store and int(object_store),
                    settings,
                    Abandon(abandon),
                )
            except PortConflict as exc:
                logger.warning(
                    "Local Ray cluster %s lost a port race (attempt %d/%d): %s",
                    request.cluster_name,
                    attempt,
                    START_ATTEMPTS,
                    exc,
                )
                last_error = exc
        assert last_error is not None
        raise LaunchError(str(last_error))

    def submit(self, handle: dict[str, Any], request: LaunchRequest) -> dict[str, Any]:
        """Submit the entrypoint to the cluster in ``handle``; returns the handle.

        Safe to call again (another process, a retried task): an existing Ray job with this
        submission_id is adopted instead of starting the entrypoint a second time.
        """
        if handle.get("submission_id") != request.submission_id:
            raise LaunchError(
                f"Handle is for submission {handle.get('submission_id')!r}, "
                f"not {request.submission_id!r}"
            )
        submission = self.plan(request)["submission"]
        # No retry here: Ray's job server itself waits for the head's job agent, and a caller
        # that wants to retry may, since this call is idempotent.
        created = self._with_client(
            handle,
            lambda c: ray_jobs.submit_idempotent(
                c,
                submission_id=submission["submission_id"],
                entrypoint=submission["entrypoint"],
                runtime_env=submission["runtime_env"],
                packages=request.packages,
                entrypoint_num_cpus=submission["entrypoint_num_cpus"],
                metadata=dict(request.labels or {}),
            ),
        )
        logger.info(
            "%s Ray job %s on local cluster %s",
            "Submitted" if created else "Adopted",
            request.submission_id,
            handle["cluster_name"],
        )
        return handle

    def status(self, handle: dict[str, Any]) -> RayJobState:
        """What Ray says about the job, unless the sandbox knows better: a cluster the kernel
        OOM-killed in has failed (reason ``oom_killed``). LaunchError when the dashboard
        cannot be reached or the sandbox is gone."""
        reap()
        sandbox = sandbox_of(handle)
        if sandbox is not None:
            if sandbox.oom_killed():
                return _oom_state(sandbox)
            if not sandbox.init_alive():
                raise LaunchError(f"the sandbox of cluster {handle.get('cluster_name')} is gone")
        try:
            state = self._with_client(
                handle, lambda c: ray_jobs.job_state(c, handle["submission_id"])
            )
        except LaunchError:
            # A cluster the kernel is OOM-killing stops answering: say why, not just "lost";
            # so does one whose Ray died for want of disk.
            if sandbox is not None and sandbox.oom_killed():
                return _oom_state(sandbox)
            if sandbox is not None and sandbox.disk_full():
                return _disk_full_state(sandbox)
            raise
        if state.status == RAY_FAILED and sandbox is not None and sandbox.disk_full():
            return _disk_full_state(sandbox)
        return state

    def logs(self, handle: dict[str, Any], *, tail: int | None = None) -> str:
        """The driver log (its last ``tail`` lines when given), at most its last LOG_LIMIT
        bytes, read from the file the head writes; from Ray while there is no such file on
        this host (the dashboard's answer is size-capped)."""
        if tail is not None:
            text = driver_log_lines(handle, max(0, tail), limit=LOG_LIMIT)
        else:
            part = driver_log_part(handle, since=None, limit=LOG_LIMIT)
            text = None if part is None else part.text
        if text is not None:
            return text
        return self._with_client(
            handle,
            lambda c: ray_jobs.job_logs(c, handle["submission_id"], tail=tail, limit=LOG_LIMIT),
        )

    def log_part(self, handle: dict[str, Any], *, since: int | None = None, limit: int) -> LogPart:
        """At most ``limit`` bytes of the driver log file the head writes, by seeking (from
        ``since``, else from its end); cut from Ray's size-capped answer while there is no
        such file on this host."""
        part = driver_log_part(handle, since=since, limit=limit)
        if part is not None:
            return part
        return self._with_client(
            handle,
            lambda c: ray_jobs.log_part(c, handle["submission_id"], since=since, limit=limit),
        )

    def follow_logs(self, handle: dict[str, Any]) -> Iterator[str]:
        """The driver log file the head writes on this host, read as it grows, until Ray says
        the job ended; Ray's tail where this process cannot see the cluster's files."""
        if not os.path.isdir(handle.get("temp_dir") or ""):
            yield from ray_jobs.follow_logs(self.client(handle), handle["submission_id"])
            return
        yield from follow_driver_log(handle, lambda: self.status(handle).status in RAY_TERMINAL)

    def heal(self, handle: dict[str, Any], *, max_restarts: int) -> list[dict[str, Any]]:
        """Start every dead worker node again (see :func:`.nodes.heal_workers`)."""
        return heal_workers(handle, max_restarts=max_restarts)

    def stop_driver(self, handle: dict[str, Any]) -> bool:
        """Ray's stop_job through the cluster's Jobs API: SIGTERM to the driver, the cluster
        stays up (see :meth:`stop` for the rest)."""
        self._with_client(handle, lambda c: ray_jobs.stop_job(c, handle["submission_id"]))
        return True

    def stop(self, handle: dict[str, Any]) -> None:
        """Kill every process of the cluster (worker nodes before the head) and delete its temp
        dir. Never raises; stopping a cluster that is already gone does nothing."""
        with self._clients_lock:
            self._clients.pop((handle.get("dashboard_url", ""), handle.get("token", "")), None)
        try:
            teardown(handle)
        except Exception:
            logger.exception("Stopping local Ray cluster %s failed", handle.get("cluster_name"))

    def find_started(self, request: LaunchRequest) -> list[dict[str, Any]]:
        """The request's clusters among :meth:`find_clusters`: each wrote its handle next to
        itself before its first node started."""
        found = self.find_clusters(request.target_config)
        return [h for h in found if h.get("submission_id") == request.submission_id]

    def find_clusters(self, target_config: dict[str, Any]) -> list[dict[str, Any]]:
        """The clusters whose dirs (with their ``handle.json``) exist under the target's
        ``work_dir``, running or not."""
        return discover_handles((target_config or {}).get("work_dir"))

    # -- beyond the contract -------------------------------------------------------------------

    def bind_warm(self, handle: dict[str, Any], request: LaunchRequest) -> dict[str, Any] | None:
        """Hand a warm cluster (started ahead of need for no submission) to the attempt of
        ``request``: the returned handle names the attempt's submission, here and in the
        cluster's ``handle.json``, so every later step finds it as the attempt's. None when the
        cluster is not complete and running any more (the caller stops it)."""
        expected = len(self.plan(request)["nodes"])
        if len(handle.get("nodes") or []) != expected or not nodes_running(handle):
            return None
        bound = {
            **handle,
            "submission_id": request.submission_id,
            "cluster_name": request.cluster_name,
        }
        write_handle(bound)
        return bound

    def is_alive(self, handle: dict[str, Any]) -> bool:
        """True while any process of the cluster runs or its dashboard still answers."""
        reap()
        sandbox = sandbox_of(handle)
        if sandbox is not None:
            return sandbox.init_alive() or bool(sandbox.processes())
        if ClusterProcesses(handle).members():
            return True
        try:
            answer = dashboard_http.exchange(
                "GET", f"{handle['dashboard_url']}/api/gcs_healthz", timeout=2, limit=65536
            )
        except LaunchError:
            return False
        return answer.status == 200

    def client(self, handle: dict[str, Any]) -> JobSubmissionClient:
        """An authenticated JobSubmissionClient for the cluster (cached per cluster)."""
        key = (handle["dashboard_url"], handle["token"])
        with self._clients_lock:
            cached = self._clients.get(key)
            if cached is not None:
                self._clients.move_to_end(key)
                return cached
        new = ray_jobs.make_client(handle["dashboard_url"], handle["token"])
        with self._clients_lock:
            self._clients[key] = new
            while len(self._clients) > 32:
                self._clients.popitem(last=False)
        return new

    def _with_client(self, handle: dict[str, Any], call: Any) -> Any:
        try:
            return call(self.client(handle))
        except LaunchError:
            # The cached client may point at a dead cluster; the next call builds a fresh one.
            with self._clients_lock:
                self._clients.pop((handle["dashboard_url"], handle["token"]), None)
            raise

    def _adopt_cluster(
        self, request: LaunchRequest, expected_nodes: int, base_dir: str, timeout: float
    ) -> dict[str, Any] | None:
        """The handle of a complete, running cluster already started for this submission (by a
        call whose caller crashed before storing the handle), or None. Incomplete leftovers
        are stopped, so that start_cluster() can start afresh."""
        for handle in discover_handles(base_dir):
            if handle.get("submission_id") != request.submission_id:
                continue
            nodes = handle.get("nodes") or []
            if len(nodes) == expected_nodes and nodes_running(handle):
                try:
                    wait_for_nodes(handle, expected_nodes, time.monotonic() + timeout)
                except LaunchError as exc:
                    logger.warning("Not adopting cluster %s: %s", handle["temp_dir"], exc)
                else:
                    logger.info("Adopting running local Ray cluster %s", handle["temp_dir"])
                    sandbox = sandbox_of(handle)
                    if sandbox is not None:  # its starter may have died before capping it
                        sandbox.cgroups.settle_cpu()
                    return handle
            logger.warning("Stopping incomplete local Ray cluster %s", handle["temp_dir"])
            self.stop(handle)
        return None


# -- spec → nodes ----------------------------------------------------------------------------------


def _whole(value: Any, what: str) -> int:
    number = float(value or 0)
    if number < 0 or not number.is_integer():
        raise LaunchError(f"{what}: the local launcher needs a whole, non-negative number")
    return int(number)


def _node_resources(spec: dict[str, Any], what: str) -> dict[str, Any]:
    resources = dict(spec.get("resources") or {})
    reserved = {"CPU", "GPU", "memory", "object_store_memory"} & set(resources)
    if reserved:
        raise LaunchError(f"{what}: use cpu/gpu/memory_gb instead of resources {sorted(reserved)}")
    # Ray rejects fractional node resources only once the node starts; say so up front.
    resources = {name: _whole(n, f"{what} resource {name!r}") for name, n in resources.items()}
    memory_gb = float(spec.get("memory_gb") or 0)
    return {
        "num_cpus": _whole(spec.get("cpu", 0), f"{what} cpu"),
        "num_gpus": _whole(spec.get("gpu", 0), f"{what} gpu"),
        # None lets Ray size it from the host; 0 would make the node unschedulable for memory.
        "memory_bytes": int(memory_gb * GIB) if memory_gb > 0 else None,
        "disk_bytes": gb_to_bytes(spec.get("disk_gb")),  # None: the sandbox's default
        "resources": resources,
    }


def _of_flavor(node: dict[str, Any], flavor: str) -> dict[str, Any]:
    """A GPU node of ``flavor``: its sandbox gets only devices of that type, and it advertises
    Ray's ``accelerator_type:<TYPE>`` resource (what ``@ray.remote(accelerator_type=...)``
    asks for)."""
    if not node["num_gpus"]:
        return node
    resources = {**node["resources"], f"accelerator_type:{flavor.upper()}": 1}
    return {**node, "gpu_flavor": flavor, "resources": resources}


def _isolation_plan(
    settings: SandboxSettings, nodes: list[dict[str, Any]], config: dict[str, Any]
) -> dict[str, Any]:
    """What a start would enforce, without starting anything."""
    if settings.mode != MODE_SANDBOX:
        return {"mode": settings.mode, "enforced": "nothing: single-user mode"}
    configured = config.get("object_store_memory_bytes")
    named, stores = sandbox_nodes(settings, nodes, configured and int(configured))
    limits = sandbox_limits(settings, named, stores)
    enforced = limits["nodes"]
    return {
        "mode": MODE_SANDBOX,
        "uid_range": list(settings.uid_range),
        "namespaces": list(ENTERED_NAMESPACES),
        "network": NETWORK_NAT if egress_available(settings) else NETWORK_LOOPBACK,
        "egress": "public internet only, and the allow-list"
        if egress_available(settings)
        else "none",
        "egress_allow": list(settings.egress_allow),
        "limits": limits,
        # Each node's share of the limits, in the units admission counts: it reserves their
        # total for the job (isolation.cluster_footprint, the same arithmetic).
        "footprint": {
            "nodes": {
                name: {
                    "cpu": node["cpu"],
                    "memory_gb": node["memory_bytes"] / GIB,
                    "disk_gb": node["disk_bytes"] / GIB,
                }
                for name, node in enforced.items()
            },
            "total": {
                "cpu": sum(node["cpu"] for node in enforced.values()),
                "memory_gb": limits["memory_bytes"] / GIB,
                "disk_gb": limits["disk_bytes"] / GIB,
            },
        },
        "gpu_inventory": list(settings.gpus),
    }


_support: dict[SandboxSettings, list[str]] = {}


def _host_support(settings: SandboxSettings) -> list[str]:
    if settings not in _support:
        _support[settings] = host_support(settings)
    return _support[settings]


def _oom_state(sandbox: Sandbox) -> RayJobState:
    limit = sandbox.state.get("limits", {}).get("memory_bytes", 0)
    return RayJobState(
        RAY_FAILED,
        f"the cluster exceeded its memory limit of {limit / GIB:.1f} GiB and the kernel "
        "killed a process in it",
        reason="oom_killed",
    )


def _disk_full_state(sandbox: Sandbox) -> RayJobState:
    return RayJobState(
        RAY_FAILED, disk.full_message(sandbox.state.get("disk") or {}), reason="disk_full"
    )
