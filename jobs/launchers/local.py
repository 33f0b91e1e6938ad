"""The ``local`` launcher: one real, throw-away Ray cluster per attempt, on this host.

Each attempt gets its own head node plus one node per worker replica, every node a separate
``ray start --block`` process in its own session (so its process group can be signalled as one)
with its own ports and its own ``--temp-dir``. Nodes advertise exactly their spec's CPUs, GPUs
(logical: no GPU needs to be present), memory and custom resources, so a job sees the cluster
shape it asked for. The head advertises 0 CPUs by default: it only runs the entrypoint, which is
submitted with ``entrypoint_num_cpus=0``.

Every node of a cluster runs in that cluster's sandbox (``sandbox.py``: its own uid, PID,
mount, IPC, UTS and network namespaces, cgroups) unless the operator's ``sandbox`` settings say
``mode: off`` (single-user mode). In a sandbox Ray's ports live in the cluster's own network
and only the dashboard is forwarded to the host's 127.0.0.1.

Promises:

* Token authentication is always on: a fresh random token per cluster, given to every node as
  ``RAY_AUTH_MODE=token`` / ``RAY_AUTH_TOKEN`` and sent by us as ``Authorization: Bearer``.
  A request without it gets HTTP 401 from the dashboard.
* Nodes do not inherit this service's environment (database URLs, secret keys), only a short
  allow-list (PATH, HOME, locale, ...) plus what Ray needs, so the job's code cannot read them.
* Clusters side by side never share a port, a temp dir or a process group, and nothing here
  ever runs ``ray stop`` (which would kill every Ray process on the host).
* The handle is plain JSON and self-sufficient: :meth:`status`, :meth:`logs`, :meth:`stop` and
  :meth:`is_alive` work from any process on this host, e.g. a Celery worker that replaced the
  one that launched. Processes are only signalled once ``/proc`` shows they are this cluster's
  (its token in their environment, or a child or process-group member of such a process), so
  a stale handle cannot kill a stranger that reused a pid.
* :meth:`stop` is idempotent, never raises, and leaves no process and no temp dir behind.

Not promised: ``min_replicas``/``max_replicas`` (no autoscaling; ``replicas`` nodes are started)
and ``image`` (nodes run this host's Python and Ray). Without a sandbox, Ray replaces
``--node-ip-address=127.0.0.1`` with the host's address, so GCS and raylets listen beyond
loopback: only the token guards them.

Idempotency across a crash: ``launch()`` is ``start_cluster()`` + ``submit()``, but a caller that
must survive being killed between the two calls them separately::

    handle = launcher.start_cluster(request)   # persist handle on the attempt row, then
    launcher.submit(handle, request)           # safe to repeat: a retry adopts the Ray job

A retried task that finds a handle on its row calls ``submit()`` again: Ray refuses a second job
with the same ``submission_id`` and :func:`ray_jobs.submit_idempotent` adopts the existing one,
so the entrypoint never runs twice. A task killed after ``start_cluster()`` but before it stored
the handle is covered too: every cluster writes its handle to ``handle.json`` (mode 0600) in its
temp dir, and ``start_cluster()`` (so ``launch()``) returns the running cluster of the same
submission_id under the same ``work_dir`` instead of starting a second one. Concurrent calls for
one submission are not serialized here; the caller's row lock must prevent them.
:func:`discover_handles` lists every cluster, for sweeping those no attempt owns.

Settings read from ``request.target_config`` (all optional):

* ``work_dir``: where per-cluster temp dirs go (default: the system temp dir). Keep it short:
  Ray puts unix sockets under it and socket paths must stay under 108 bytes.
* ``start_timeout_seconds`` (120): how long all nodes may take to come up.
* ``stop_grace_seconds`` (3): SIGTERM-to-SIGKILL delay when stopping.
* ``object_store_memory_bytes``: plasma store size per node (default: 30% of its memory).
* ``sandbox``: the operator's :class:`~.sandbox.SandboxSettings` (never a tenant's: the service
  sets it over whatever a target config holds).
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import json
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import requests

from . import ray_jobs
from .base import (
    RAY_FAILED,
    RAY_TERMINAL,
    LaunchAbandoned,
    LaunchError,
    LaunchRequest,
    NodeFailures,
    RayJobState,
)
from .sandbox import (
    MODE_OFF,
    MODE_SANDBOX,
    NAMESPACES,
    NETWORK_LOOPBACK,
    NETWORK_NAT,
    Sandbox,
    SandboxSettings,
    egress_available,
    host_support,
    process_start_time,
    sandbox_limits,
)

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

logger = logging.getLogger(__name__)

KIND = "local"
CLUSTER_DIR_PREFIX = "mr-"  # short: see _SOCKET_SUFFIX_LEN
HANDLE_FILE = "handle.json"
GIB = 1024**3
LOOPBACK = "127.0.0.1"

DEFAULT_START_TIMEOUT = 120.0
DEFAULT_STOP_GRACE = 3.0
# After SIGKILL, how long to wait for every process to be gone (reaped) before giving up.
KILL_WAIT = 15.0
ZOMBIE_WAIT = 3.0
FOLLOW_POLL = 0.2  # seconds between reads at the end of a followed driver log
FOLLOW_CHUNK = 65536
START_ATTEMPTS = 3  # a port taken between our check and Ray's bind costs one more attempt

# `ray start` flag for each port a node listens on. Ray's fixed defaults (6379, 8265, 10001,
# 52365, worker ports 10002-19999) collide as soon as two clusters share a host; every port is
# therefore chosen by us, except the workers' (see _start_node).
_PORT_FLAGS = {
    "gcs": "--port",
    "dashboard": "--dashboard-port",
    "client_server": "--ray-client-server-port",
    "dashboard_agent_listen": "--dashboard-agent-listen-port",
    "dashboard_agent_grpc": "--dashboard-agent-grpc-port",
    "node_manager": "--node-manager-port",
    "object_manager": "--object-manager-port",
    "metrics_export": "--metrics-export-port",
    "runtime_env_agent": "--runtime-env-agent-port",
}
_HEAD_ONLY_PORTS = ("gcs", "dashboard", "client_server")
_HEAD_PORTS = tuple(_PORT_FLAGS)
_WORKER_PORTS = tuple(p for p in _PORT_FLAGS if p not in _HEAD_ONLY_PORTS)

# Longest suffix Ray appends to a node's --temp-dir for a unix socket:
# "/session_2026-01-01_00-00-00_123456_1234567/sockets/plasma_store" is 64 bytes.
_SOCKET_SUFFIX_LEN = 66
_MAX_UNIX_SOCKET_PATH = 107

# Environment a node may inherit from this process; everything else (secrets) stays here.
_ENV_ALLOWLIST = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "VIRTUAL_ENV",
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
)

# How Ray reports a port someone else took between our check and its bind. `ray start` does not
# exit on it: a GCS that cannot bind dies while `ray start` waits for it forever, and a dashboard
# that cannot bind is skipped ("already occupied"), so we look for these in the node's logs.
_RAY_STARTED = "Ray runtime started"
_PORT_CONFLICT = re.compile(r"address already in use|already occupied|EADDRINUSE", re.IGNORECASE)

# Popen objects of nodes this process started, so we can reap them; other processes reap
# nothing (the nodes are not their children) and rely on init instead.
_popens: dict[int, subprocess.Popen[bytes]] = {}
_popens_lock = threading.Lock()


class LocalRayLauncher:
    """Runs each attempt on its own ephemeral Ray cluster made of local processes."""

    kind = KIND

    def __init__(self) -> None:
        # Building a JobSubmissionClient costs two HTTP round trips; reuse them per cluster.
        self._clients: OrderedDict[tuple[str, str], JobSubmissionClient] = OrderedDict()
        self._clients_lock = threading.Lock()

    # -- Launcher protocol ---------------------------------------------------------------------

    def plan(self, request: LaunchRequest) -> dict[str, Any]:
        """The nodes and the submission launch() would start. Raises LaunchError for a spec
        this launcher cannot run (e.g. fractional CPUs: ``ray start`` takes whole numbers)."""
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

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        """start_cluster() then submit(); the cluster is torn down again if submitting fails."""
        handle = self.start_cluster(request)
        try:
            return self.submit(handle, request)
        except BaseException:
            self.stop(handle)
            raise

    def status(self, handle: dict[str, Any]) -> RayJobState:
        """What Ray says about the job, unless the sandbox knows better: a cluster the kernel
        OOM-killed in has failed (reason ``oom_killed``). LaunchError when the dashboard
        cannot be reached or the sandbox is gone."""
        _reap()
        sandbox = _sandbox_of(handle)
        if sandbox is not None:
            if sandbox.oom_killed():
                return _oom_state(sandbox)
            if not sandbox.init_alive():
                raise LaunchError(f"the sandbox of cluster {handle.get('cluster_name')} is gone")
        try:
            return self._with_client(
                handle, lambda c: ray_jobs.job_state(c, handle["submission_id"])
            )
        except LaunchError:
            # A cluster the kernel is OOM-killing stops answering: say why, not just "lost".
            if sandbox is not None and sandbox.oom_killed():
                return _oom_state(sandbox)
            raise

    def logs(self, handle: dict[str, Any], *, tail: int | None = None) -> str:
        """The driver log from Ray (its last ``tail`` lines when given). When the dashboard
        cannot answer (a cluster the kernel is OOM-killing, a dead head), the log file the
        head wrote is read instead, while the cluster's dir exists."""
        try:
            return self._with_client(
                handle, lambda c: ray_jobs.job_logs(c, handle["submission_id"], tail=tail)
            )
        except LaunchError:
            text = _driver_log_file(handle)
            if text is None:
                raise
            return ray_jobs.tail_lines(text, tail)

    def follow_logs(self, handle: dict[str, Any]) -> Iterator[str]:
        """Read from the driver log the head writes on this host, 64 KiB at a time, every
        FOLLOW_POLL seconds at its end (Ray's own tail polls once a second, through two
        hops); Ray's tail where this process cannot see the cluster's files."""
        if not os.path.isdir(handle.get("temp_dir") or ""):
            yield from ray_jobs.follow_logs(self.client(handle), handle["submission_id"])
            return
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        log, ended, asked = None, False, 0.0
        try:
            while True:
                log = log or _open_driver_log(handle)
                chunk = log.read(FOLLOW_CHUNK) if log is not None else b""
                if chunk:
                    yield decoder.decode(chunk)
                    continue
                if ended:
                    rest = decoder.decode(b"", final=True)
                    if rest:
                        yield rest
                    return
                if time.monotonic() - asked >= 1.0:
                    asked = time.monotonic()
                    # once Ray says the job ended, read what is left, then stop
                    ended = self.status(handle).status in RAY_TERMINAL
                    continue
                time.sleep(FOLLOW_POLL)
        finally:
            if log is not None:
                log.close()

    def stop(self, handle: dict[str, Any]) -> None:
        """Kill every process of the cluster (worker nodes before the head) and delete its temp
        dir. Never raises; stopping a cluster that is already gone does nothing."""
        with self._clients_lock:
            self._clients.pop((handle.get("dashboard_url", ""), handle.get("token", "")), None)
        try:
            _teardown(handle)
        except Exception:
            logger.exception("Stopping local Ray cluster %s failed", handle.get("cluster_name"))

    # -- Beyond the protocol -------------------------------------------------------------------

    def start_cluster(
        self, request: LaunchRequest, *, abandon: Callable[[], str] | None = None
    ) -> dict[str, Any]:
        """Start the head and all worker nodes and wait until every node is alive in Ray.

        ``abandon`` is asked, at most twice a second while nodes start, whether to stop: a
        non-empty answer (why) tears down what has started and raises LaunchAbandoned.

        Returns the handle. Raises LaunchError (after tearing down whatever had started) when a
        node dies during start-up or the cluster is not complete within the start timeout.
        """
        _reap()
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
                return _start_cluster_once(
                    request,
                    nodes,
                    base_dir,
                    timeout,
                    grace,
                    object_store and int(object_store),
                    settings,
                    _Abandon(abandon),
                )
            except _PortConflict as exc:
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
            if len(nodes) == expected_nodes and _nodes_running(handle):
                try:
                    _wait_for_nodes(handle, expected_nodes, time.monotonic() + timeout)
                except LaunchError as exc:
                    logger.warning("Not adopting cluster %s: %s", handle["temp_dir"], exc)
                else:
                    logger.info("Adopting running local Ray cluster %s", handle["temp_dir"])
                    return handle
            logger.warning("Stopping incomplete local Ray cluster %s", handle["temp_dir"])
            self.stop(handle)
        return None

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

    def is_alive(self, handle: dict[str, Any]) -> bool:
        """True while any process of the cluster runs or its dashboard still answers."""
        _reap()
        sandbox = _sandbox_of(handle)
        if sandbox is not None:
            return sandbox.init_alive() or bool(sandbox.processes())
        if _ClusterProcesses(handle).members():
            return True
        try:
            r = requests.get(f"{handle['dashboard_url']}/api/gcs_healthz", timeout=2)
            return r.ok
        except requests.RequestException:
            return False

    def heal(self, handle: dict[str, Any], *, max_restarts: int) -> list[dict[str, Any]]:
        """Start again, with the same spec, ports and sandbox, every worker node whose process
        is gone; Ray then retries the tasks it lost there. Returns the records of the nodes
        restarted (the handle is updated in place and on disk: the caller stores it).

        A node may be restarted ``max_restarts`` times; one more loss raises NodeFailures.
        A lost head is not healed here: without its GCS the cluster is lost (``status``
        says so) and the attempt ends ``cluster_lost``.
        """
        _reap()
        nodes = handle.get("nodes") or []
        sandbox = _sandbox_of(handle)
        if not nodes or not _node_alive(nodes[0]):
            return []
        if sandbox is not None and not sandbox.init_alive():
            return []
        restarted = []
        on_disk = _read_handle(handle.get("temp_dir", ""))
        for number, node in enumerate(nodes):
            if node.get("role") == "head" or _node_alive(node):
                continue
            newer = _newer_node(on_disk, node)
            if newer is not None:  # restarted by a caller that died before storing the handle
                nodes[number] = newer
                restarted.append(newer)
                continue
            restarts = node.get("restarts", 0) + 1
            if restarts > max_restarts or "spec" not in node:
                raise NodeFailures(
                    f"Ray worker node {node['name']} ({node.get('group')}) died "
                    f"{restarts} times; it is restarted at most {max_restarts} times"
                )
            _kill_node(handle, node, sandbox)
            logger.warning(
                "Ray worker node %s of cluster %s died; starting it again (%d of %d)",
                node["name"],
                handle.get("cluster_name"),
                restarts,
                max_restarts,
            )
            record = _start_node(
                handle,
                {**{k: node[k] for k in ("role", "group", "index") if k in node}, **node["spec"]},
                node["name"],
                node["ports"],
                _node_env(handle["token"], None if sandbox else handle["temp_dir"]),
                node.get("object_store_bytes"),
                sandbox,
                os.path.dirname(node["temp_dir"]),
                restarts=restarts,
            )
            nodes[number] = record
            restarted.append(record)
        if restarted:
            _write_handle(handle)
        return restarted

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


# -- Spec → node resources ---------------------------------------------------------------------


def _oom_state(sandbox: Sandbox) -> RayJobState:
    limit = sandbox.state.get("limits", {}).get("memory_bytes", 0)
    return RayJobState(
        RAY_FAILED,
        f"the cluster exceeded its memory limit of {limit / GIB:.1f} GiB and the kernel "
        "killed a process in it",
        reason="oom_killed",
    )


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
        "resources": resources,
    }


# -- Starting ----------------------------------------------------------------------------------


class _Abandon:
    """Asks the caller, at most every half second, whether a start should stop."""

    def __init__(self, ask: Callable[[], str] | None) -> None:
        self._ask, self._next = ask, 0.0

    def check(self) -> None:
        if self._ask is None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + 0.5
        reason = self._ask()
        if reason:
            raise LaunchAbandoned(f"the cluster's start stopped: {reason}")


class _PortConflict(LaunchError):
    """A node could not bind one of its ports: retry the whole cluster with fresh ports."""


def _start_cluster_once(
    request: LaunchRequest,
    nodes: list[dict[str, Any]],
    base_dir: str,
    timeout: float,
    grace: float,
    object_store_bytes: int | None,
    settings: SandboxSettings,
    abandon: _Abandon,
) -> dict[str, Any]:
    cluster_dir = tempfile.mkdtemp(prefix=CLUSTER_DIR_PREFIX, dir=base_dir)
    token = secrets.token_hex(32)
    sandboxed = settings.mode == MODE_SANDBOX
    handle: dict[str, Any] = {
        "kind": KIND,
        "cluster_name": request.cluster_name,
        "submission_id": request.submission_id,
        "temp_dir": cluster_dir,
        "token": token,
        "dashboard_url": "",
        "gcs_address": "",
        "stop_grace_seconds": grace,
        "isolation": {"mode": settings.mode},
        "nodes": [],
    }
    names = _node_names(len(nodes))
    try:
        # Nodes keep their Ray state in <cluster>/s, the only directory a sandbox may write.
        node_root = os.path.join(cluster_dir, "s") if sandboxed else cluster_dir
        longest = os.path.join(node_root, f"{names[-1]}r9")  # a node's name once restarted
        if len(longest) + _SOCKET_SUFFIX_LEN > _MAX_UNIX_SOCKET_PATH:
            raise LaunchError(
                f"work_dir {base_dir!r} is too long: Ray's unix socket paths under it would "
                f"exceed {_MAX_UNIX_SOCKET_PATH} bytes"
            )
        started = time.monotonic()
        deadline = started + timeout
        sandbox = None
        if sandboxed:
            nodes, stores = _sandbox_nodes(settings, nodes, object_store_bytes)
            sandbox = Sandbox.create(
                settings=settings,
                work_dir=base_dir,
                cluster_dir=cluster_dir,
                hostname=request.cluster_name,
                nodes=nodes,
                object_store_bytes=stores,
                track=_track,
            )
            handle["sandbox"] = sandbox.to_json()
            handle["isolation"] = sandbox.summary()
            # Ray's ports live in the sandbox's own network namespace: nothing else binds
            # there, so fixed numbers never collide; the host sees only the forwarded one.
            port_sets = _sandbox_ports(len(nodes))
            handle["dashboard_url"] = f"http://{LOOPBACK}:{sandbox.state['forward_port']}"
            env = _node_env(token, None)
        else:
            counts = [len(_HEAD_PORTS)] + [len(_WORKER_PORTS)] * (len(nodes) - 1)
            free = iter(_pick_free_ports(sum(counts)))
            port_sets = [{name: next(free) for name in _HEAD_PORTS}] + [
                {name: next(free) for name in _WORKER_PORTS} for _ in nodes[1:]
            ]
            handle["dashboard_url"] = f"http://{LOOPBACK}:{port_sets[0]['dashboard']}"
            env = _node_env(token, cluster_dir)
            stores = dict.fromkeys(names, object_store_bytes)
        handle["gcs_address"] = f"{LOOPBACK}:{port_sets[0]['gcs']}"
        _write_handle(handle)

        for number, (name, node, ports) in enumerate(zip(names, nodes, port_sets, strict=True)):
            abandon.check()
            record = _start_node(handle, node, name, ports, env, stores[name], sandbox, node_root)
            handle["nodes"].append(record)
            _write_handle(handle)  # now, so that even a crash during start-up leaves it findable
            if number == 0:
                _wait_for_gcs(handle, deadline, abandon)
                logger.debug(
                    "%s: GCS up after %.1fs", request.cluster_name, time.monotonic() - started
                )
            # Workers only need the GCS; starting them all now overlaps their start-up with
            # the head's dashboard coming up.
        _wait_for_nodes(handle, len(nodes), deadline, abandon)
    except BaseException:
        _teardown(handle)
        raise
    logger.info(
        "Local Ray cluster %s is up after %.1fs: %d nodes, dashboard %s, isolation %s",
        request.cluster_name,
        time.monotonic() - started,
        len(nodes),
        handle["dashboard_url"],
        settings.mode,
    )
    return handle


def _sandbox_ports(count: int) -> list[dict[str, int]]:
    head = {"gcs": 6379, "dashboard": 8265, "client_server": 10001}
    sets = []
    for number in range(count):
        names = _HEAD_PORTS if number == 0 else _WORKER_PORTS
        ports = {name: head[name] for name in names if name in head}
        free = (p for p in range(20000 + number * 20, 20020 + number * 20))
        ports.update({name: next(free) for name in names if name not in ports})
        sets.append(ports)
    return sets


def _node_names(count: int) -> list[str]:
    """A cluster's node names: the head, then its workers (short: they are in socket paths)."""
    return ["h", *(f"w{number}" for number in range(count - 1))]


def _sandbox_nodes(
    settings: SandboxSettings, nodes: list[dict[str, Any]], object_store_bytes: int | None
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The nodes as a sandbox runs them — named, and with the memory its limit counts for a
    node whose spec names none (so Ray never promises more than the cgroup allows) — and each
    node's object store: the target's setting, else 30 % of its memory (Ray's own rule)."""
    named = [
        {
            **node,
            "name": name,
            "memory_bytes": node["memory_bytes"] or settings.default_node_memory_bytes,
        }
        for name, node in zip(_node_names(len(nodes)), nodes, strict=True)
    ]
    stores = {
        node["name"]: object_store_bytes or max(100 * 1024**2, int(node["memory_bytes"] * 0.3))
        for node in named
    }
    return named, stores


def _isolation_plan(
    settings: SandboxSettings, nodes: list[dict[str, Any]], config: dict[str, Any]
) -> dict[str, Any]:
    """What a launch would enforce, without starting anything."""
    if settings.mode != MODE_SANDBOX:
        return {"mode": settings.mode, "enforced": "nothing: single-user mode"}
    configured = config.get("object_store_memory_bytes")
    named, stores = _sandbox_nodes(settings, nodes, configured and int(configured))
    return {
        "mode": MODE_SANDBOX,
        "uid_range": list(settings.uid_range),
        "namespaces": list(NAMESPACES),
        "network": NETWORK_NAT if egress_available(settings) else NETWORK_LOOPBACK,
        "limits": sandbox_limits(settings, named, stores),
        "gpu_inventory": list(settings.gpus),
    }


_support: dict[SandboxSettings, list[str]] = {}


def _host_support(settings: SandboxSettings) -> list[str]:
    if settings not in _support:
        _support[settings] = host_support(settings)
    return _support[settings]


def _sandbox_of(handle: dict[str, Any] | None) -> Sandbox | None:
    state = (handle or {}).get("sandbox")
    return Sandbox(state) if state else None


def _nodes_running(handle: dict[str, Any]) -> bool:
    sandbox = _sandbox_of(handle)
    nodes = handle.get("nodes") or []
    if sandbox is not None:
        return sandbox.init_alive() and all(_pid_running(n["pid"]) for n in nodes)
    running = {p.pid for p in _ClusterProcesses(handle).members()}
    return all(n["pid"] in running for n in nodes)


def _node_alive(node: dict[str, Any]) -> bool:
    """The node's ``ray start --block`` still runs (the same process, not a later one that
    reuses its pid; a zombie is dead). It exits once any Ray process of its node dies."""
    start = process_start_time(node["pid"])
    return start is not None and start == node.get("start", start)


def _kill_node(handle: dict[str, Any], node: dict[str, Any], sandbox: Sandbox | None) -> None:
    """Kill what is left of a dead node (workers it started may linger) before it starts
    again: in a sandbox, every process of the node's cgroup; else the cluster's processes in
    its process group."""
    if sandbox is not None:
        pids = sandbox.cgroups.node_pids(node["name"])
    else:
        pids = {p.pid for p in _ClusterProcesses(handle).members() if p.pgid == node["pgid"]}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _reap([node])


def _track(process: subprocess.Popen[bytes]) -> None:
    with _popens_lock:
        _popens[process.pid] = process


def _write_handle(handle: dict[str, Any]) -> None:
    path = os.path.join(handle["temp_dir"], HANDLE_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the token
    with os.fdopen(fd, "w") as f:
        json.dump(handle, f)


def _read_handle(cluster_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(cluster_dir, HANDLE_FILE)) as f:
            handle = json.load(f)
    except (OSError, ValueError):
        return None
    return handle if isinstance(handle, dict) and handle.get("kind") == KIND else None


def _newer_node(on_disk: dict[str, Any] | None, node: dict[str, Any]) -> dict[str, Any] | None:
    """The running restart of ``node`` that the cluster's handle file records, if any."""
    for record in (on_disk or {}).get("nodes") or []:
        if (
            record.get("name") == node["name"]
            and record.get("restarts", 0) > node.get("restarts", 0)
            and _node_alive(record)
        ):
            return record
    return None


def discover_handles(work_dir: str | None = None) -> list[dict[str, Any]]:
    """Handles of the local clusters whose temp dirs exist under ``work_dir`` (default: the
    system temp dir), running or not. For sweeping clusters whose handle never got stored."""
    base = work_dir or tempfile.gettempdir()
    handles = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    for name in names:
        if name.startswith(CLUSTER_DIR_PREFIX):
            handle = _read_handle(os.path.join(base, name))
            if handle is not None:
                handles.append(handle)
    return handles


def _pick_free_ports(count: int) -> list[int]:
    """``count`` distinct ports that nobody listens on right now.

    Candidates come from below the kernel's ephemeral range, where port-0 binds and outgoing
    connections (including other Ray clusters' worker processes) never land, so a port is much
    less likely to be taken between this check and Ray's bind. All sockets stay open until every
    port is chosen, so the ports are distinct.
    """
    low, high = 20000, _ephemeral_port_range()[0] - 1
    sockets: list[socket.socket] = []
    ports: list[int] = []
    tries = 0
    try:
        while len(ports) < count:
            tries += 1
            candidate = random.randint(low, high) if high - low > 1000 and tries < 50 * count else 0
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("", candidate))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _node_env(token: str, cluster_dir: str | None) -> dict[str, str]:
    """A node's environment: a short allow-list of ours (never secrets) plus what Ray needs.
    Without a sandbox (``cluster_dir`` given) temp files go to the cluster dir."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_ALLOWLIST or k.startswith("LC_")}
    bin_dir = os.path.dirname(sys.executable)
    if cluster_dir is not None:
        # Ray's dashboard (multiprocessing) and the job itself leave temp files behind when
        # killed; inside the cluster dir they go away with it.
        env["TMPDIR"] = os.path.join(cluster_dir, "tmp")
        os.makedirs(env["TMPDIR"], exist_ok=True)
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH") or os.defpath])
    else:
        # The sandbox sets HOME, USER and TMPDIR; the host's PATH may name hidden places.
        for name in ("HOME", "USER", "LOGNAME", "SHELL", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES"):
            env.pop(name, None)
        env["PATH"] = os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"])
    # `python` in an entrypoint must be this interpreter, the one that has ray installed.
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN"] = token
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def _ray_command() -> list[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    if os.access(beside, os.X_OK):
        return [beside]
    return [sys.executable, "-m", "ray.scripts.scripts"]


def _start_node(
    handle: dict[str, Any],
    node: dict[str, Any],
    name: str,
    ports: dict[str, int],
    env: dict[str, str],
    object_store_bytes: int | None,
    sandbox: Sandbox | None,
    node_root: str,
    *,
    restarts: int = 0,
) -> dict[str, Any]:
    """Start one node; returns its record for the handle (which the caller stores). A node
    started again after it died gets a fresh temp dir: Ray's sockets of the dead one stay."""
    node_dir = os.path.join(node_root, f"{name}r{restarts}" if restarts else name)
    if sandbox is None:
        os.mkdir(node_dir)  # in a sandbox, Ray creates it as the sandbox's uid
    command = [
        *_ray_command(),
        "start",
        "--block",
        f"--temp-dir={node_dir}",
        f"--node-ip-address={LOOPBACK}",
        f"--dashboard-host={LOOPBACK}",
        "--disable-usage-stats",
        f"--num-cpus={node['num_cpus']}",
        f"--num-gpus={node['num_gpus']}",
        # 0/0: each worker process binds a port the kernel picks; a fixed range would both
        # collide across clusters and cap how many worker processes a node can run.
        "--min-worker-port=0",
        "--max-worker-port=0",
    ]
    if node["role"] == "head":
        # No autoscaler monitor: the cluster never scales, and on a small host every process
        # fewer shortens the start.
        command += ["--head", "--include-dashboard=true", "--no-monitor"]
    else:
        command.append(f"--address={handle['gcs_address']}")
    command += [f"{_PORT_FLAGS[port]}={number}" for port, number in ports.items()]
    if node["memory_bytes"]:
        command.append(f"--memory={node['memory_bytes']}")
    if node["resources"]:
        command.append(f"--resources={json.dumps(node['resources'])}")
    if object_store_bytes:
        command.append(f"--object-store-memory={object_store_bytes}")

    if sandbox is not None:
        env = {**env, **sandbox.node_env(name)}
        command = sandbox.node_command(name, command, cwd=node_root)
    log_path = os.path.join(handle["temp_dir"], f"{name}.log")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=handle["temp_dir"],
            start_new_session=True,
        )
    with _popens_lock:
        _popens[process.pid] = process
    record = {k: v for k, v in node.items() if k in ("role", "group", "index")}
    record.update(
        name=name,
        uid=sandbox.state["uid"] if sandbox is not None else None,
        pid=process.pid,
        pgid=process.pid,  # start_new_session: the node is its own process group leader
        start=process_start_time(process.pid),
        temp_dir=node_dir,
        log=log_path,
        ports=ports,
        # what it takes to start it again, the same way
        spec={k: node[k] for k in ("num_cpus", "num_gpus", "memory_bytes", "resources")},
        object_store_bytes=object_store_bytes,
        restarts=restarts,
    )
    return record


def _wait_for_gcs(handle: dict[str, Any], deadline: float, abandon: _Abandon) -> None:
    host, port = handle["gcs_address"].rsplit(":", 1)
    while True:
        _check_nodes_running(handle)
        abandon.check()
        if handle.get("sandbox"):
            # The GCS listens in the sandbox's network only: `ray start` says when it is up.
            if _RAY_STARTED in _read_end(handle["nodes"][0]["log"]):
                return
        else:
            try:
                with socket.create_connection((host, int(port)), timeout=0.5):
                    return
            except OSError:
                pass
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"The head's GCS did not answer on {handle['gcs_address']} in time\n"
                + _log_tail(handle["nodes"][0])
            )
        time.sleep(0.2)


def _wait_for_nodes(
    handle: dict[str, Any], expected: int, deadline: float, abandon: _Abandon | None = None
) -> None:
    url = f"{handle['dashboard_url']}/api/v0/nodes"
    headers = ray_jobs.auth_headers(handle["token"])
    alive = 0
    answered = False
    while True:
        _check_nodes_running(handle)
        if abandon is not None:
            abandon.check()
        try:
            r = requests.get(url, headers=headers, params={"limit": 10000}, timeout=5)
            if r.ok:
                if not answered:
                    answered = True
                    logger.debug("%s: dashboard answers", handle["cluster_name"])
                listed = r.json()["data"]["result"]["result"]
                alive = sum(1 for n in listed if n.get("state") == "ALIVE")
                if alive >= expected:
                    return
        except (requests.RequestException, ValueError, KeyError, TypeError):
            pass  # the dashboard is still starting
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"Only {alive} of {expected} Ray nodes were alive after the start timeout\n"
                + "".join(f"=== {n['name']} ===\n{_log_tail(n, 15)}" for n in handle["nodes"])
            )
        time.sleep(0.5)


def _check_nodes_running(handle: dict[str, Any]) -> None:
    """Raise if a node died or lost a port race while the cluster is starting."""
    for node in handle["nodes"]:
        with _popens_lock:
            process = _popens.get(node["pid"])
        if process is not None and process.poll() is not None:
            tail = _log_tail(node)
            what = f"Ray {node['role']} node {node['name']} exited during start-up "
            what += f"(exit code {process.returncode})\n{tail}"
            raise (_PortConflict if _PORT_CONFLICT.search(tail) else LaunchError)(what)
        conflict = _port_conflict(node)
        if conflict:
            raise _PortConflict(
                f"Ray {node['role']} node {node['name']} could not bind a port: {conflict}"
            )


def _node_logs(node: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, end of text) of the node's `ray start` output, then of the .err files of the Ray
    processes it started."""
    logs = [(os.path.basename(node["log"]), _read_end(node["log"]))]
    with _session_logs(node) as fd:
        if fd is not None:
            for name in sorted(n for n in os.listdir(fd) if n.endswith(".err")):
                logs.append((name, _read_session_file(node, fd, name) or ""))
    return logs


@contextlib.contextmanager
def _session_logs(node: dict[str, Any]):
    """A descriptor of the node's newest session log dir (None when there is none), reached
    without following a single link: in a sandbox, every name below the cluster's ``s/`` is
    the tenant's to change, and this process reads as root."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    parent, name = os.path.split(node["temp_dir"])
    opened: list[int] = []
    try:
        opened.append(os.open(parent, flags))  # the cluster's dir or its s/: made by us
        opened.append(os.open(name, flags, dir_fd=opened[-1]))
        sessions = sorted(n for n in os.listdir(opened[-1]) if n.startswith("session_2"))
        if not sessions:
            yield None
            return
        opened.append(os.open(sessions[-1], flags, dir_fd=opened[-1]))
        opened.append(os.open("logs", flags, dir_fd=opened[-1]))
        yield opened[-1]
    except OSError:
        yield None
    finally:
        for fd in opened:
            os.close(fd)


def _open_session_file(node: dict[str, Any], logs_fd: int, name: str):
    """A regular file in the node's session logs that the node's own user owns, opened for
    reading without following a link (None when there is none)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=logs_fd)
    except OSError:
        return None
    info = os.fstat(fd)
    owner = node.get("uid")
    if not stat.S_ISREG(info.st_mode) or (owner is not None and info.st_uid != owner):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _read_session_file(
    node: dict[str, Any], logs_fd: int, name: str, limit: int | None = 32768
) -> str | None:
    """The end of a regular file in the node's session logs that the node's own user owns."""
    f = _open_session_file(node, logs_fd, name)
    if f is None:
        return None
    with f:
        if limit is not None:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
        return f.read().decode(errors="replace")


def _open_driver_log(handle: dict[str, Any]):
    """The driver log the head node keeps on disk, opened (None when there is none yet)."""
    nodes = handle.get("nodes") or []
    if not nodes:
        return None
    with _session_logs(nodes[0]) as fd:
        if fd is None:
            return None
        return _open_session_file(nodes[0], fd, f"job-driver-{handle.get('submission_id')}.log")


def _driver_log_file(handle: dict[str, Any]) -> str | None:
    """The driver log the head node keeps on disk (None when there is none)."""
    f = _open_driver_log(handle)
    if f is None:
        return None
    with f:
        return f.read().decode(errors="replace")


def _read_end(path: str, limit: int = 32768) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _port_conflict(node: dict[str, Any]) -> str | None:
    for name, text in _node_logs(node):
        for line in text.splitlines():
            match = _PORT_CONFLICT.search(line)
            if match:
                # gRPC's lines are long nested dumps; keep the part that names the port.
                excerpt = line[max(0, match.start() - 200) : match.end() + 20].strip()
                return f"{name}: ...{excerpt}"
    return None


def _log_tail(node: dict[str, Any], lines: int = 40) -> str:
    """The end of the node's `ray start` output, plus any error logs of its Ray processes."""
    logs = _node_logs(node)
    parts = [ray_jobs.tail_lines(logs[0][1], lines)]
    # A Ray subprocess that dies (e.g. the GCS failing to bind) writes why to its own .err
    # file, not to `ray start`'s output.
    for name, text in logs[1:]:
        text = ray_jobs.tail_lines(text, 10).strip()[-1500:]
        if text:
            parts.append(f"--- {name} ---\n{text}\n")
    return "".join(parts)[-12000:]


# -- Stopping ----------------------------------------------------------------------------------


def _teardown(handle: dict[str, Any]) -> None:
    _reap()
    sandbox = _sandbox_of(handle)
    if sandbox is not None:
        _teardown_sandbox(handle, sandbox)
        return
    nodes = handle.get("nodes") or []
    grace = float(handle.get("stop_grace_seconds") or DEFAULT_STOP_GRACE)
    # Worker nodes first, so they do not spend the grace period reconnecting to a dead head.
    ordered = [n for n in nodes if n.get("role") != "head"] + [
        n for n in nodes if n.get("role") == "head"
    ]
    tracker = _ClusterProcesses(handle)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT)):
        members = tracker.members()
        if not members:
            break
        for node in ordered:
            if node["pgid"] in tracker.groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(node["pgid"], sig)
        # Ray moves worker processes and the job's driver into process groups of their own.
        for proc in members:
            if proc.pgid not in tracker.groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, sig)
        deadline = time.monotonic() + wait
        while tracker.members() and time.monotonic() < deadline:
            _reap(nodes)
            time.sleep(0.1)
        _reap(nodes)
    leftover = tracker.members()
    if leftover:
        logger.warning(
            "Processes of local Ray cluster %s survived SIGKILL: %s",
            handle.get("cluster_name"),
            [p.pid for p in leftover],
        )
    # Killed processes linger as zombies until reaped: ours by _reap, Ray's grandchildren by
    # init. Give that a moment so that the node process groups are really gone on return.
    deadline = time.monotonic() + ZOMBIE_WAIT
    while True:
        _reap(nodes)
        remaining = _group_members(nodes, tracker.groups)
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if remaining:
        logger.debug(
            "Processes of %s are not reaped yet: %s", handle.get("cluster_name"), remaining
        )
    temp_dir = handle.get("temp_dir")
    if temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _teardown_sandbox(handle: dict[str, Any], sandbox: Sandbox) -> None:
    """Killing the sandbox's init ends its PID namespace and so every process in it; what
    the cgroup still lists is killed too. Then the nodes' host-side parents exit; reap them."""
    sandbox.destroy()
    deadline = time.monotonic() + ZOMBIE_WAIT
    pids = [n["pid"] for n in handle.get("nodes") or []]
    pids += [sandbox.state.get("unshare_pid"), sandbox.state.get("slirp_pid")]
    with _popens_lock:
        ours = [p for pid in pids if pid and (p := _popens.get(pid)) is not None]
    for process in ours:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    _reap()
    temp_dir = handle.get("temp_dir")
    if temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _reap(nodes: list[dict[str, Any]] | None = None) -> None:
    """Collect the exit status of node processes that are this process's children (``nodes``,
    or every node this process ever started).

    Only through our own Popen objects: a bare waitpid on a recorded pid could steal the exit
    status of an unrelated child that got the pid later. Nodes started by another process are
    not our children; init reaps them. Called from every public method too, because a cluster
    launched here may be stopped by another process, leaving us its zombies.
    """
    with _popens_lock:
        if nodes is None:
            candidates = list(_popens.values())
        else:
            candidates = [p for n in nodes if (p := _popens.get(n.get("pid", 0))) is not None]
    for process in candidates:
        if process.poll() is not None:
            with _popens_lock:
                _popens.pop(process.pid, None)


def _group_members(nodes: list[dict[str, Any]], groups: set[int]) -> list[_Proc]:
    """Processes (zombies included) still in a node process group that is ours: one this stop
    proved ours, or one with nothing but zombies left (a stranger reusing the pgid would be
    alive)."""
    node_groups = {n["pgid"] for n in nodes}
    procs = _scan_proc(None)
    if procs is None:
        return [
            _Proc(pgid, 0, pgid, 0, False, False)
            for pgid in node_groups & groups
            if _group_exists(pgid)
        ]
    members = [p for p in procs if p.pgid in node_groups]
    live = {p.pgid for p in members if not p.zombie}
    return [p for p in members if p.pgid in groups or p.pgid not in live]


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclasses.dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: tells a process from a later one that reuses its pid
    zombie: bool
    marked: bool  # its environment carries this cluster's token


class _ClusterProcesses:
    """Finds every live process of one cluster, from any process on the host, via /proc.

    A process is the cluster's when its environment holds the cluster's token (every node gets
    it and Ray passes it on to everything it spawns), when it is in a node's process group that
    such a process proved ours, or when it descends from one of those. The last two catch Ray
    processes whose environment block was overwritten by setproctitle (dashboard modules).
    Processes found once stay tracked (by pid and start time) after they are orphaned.
    Without /proc (not Linux) the handle's node pids are all we know.
    """

    def __init__(self, handle: dict[str, Any]) -> None:
        self._nodes = handle.get("nodes") or []
        token = handle.get("token") or ""
        self._marker = f"RAY_AUTH_TOKEN={token}".encode() if token else None
        self.groups: set[int] = set()
        self._known: dict[int, int] = {}

    def members(self) -> list[_Proc]:
        procs = _scan_proc(self._marker)
        if procs is None:
            self.groups = {n["pgid"] for n in self._nodes}
            return [
                _Proc(n["pid"], 0, n["pgid"], 0, False, False)
                for n in self._nodes
                if _pid_running(n["pid"])
            ]
        node_groups = {n["pgid"] for n in self._nodes}
        self.groups |= {p.pgid for p in procs if p.marked and p.pgid in node_groups}
        seeds = [
            p.pid
            for p in procs
            if p.marked or p.pgid in self.groups or self._known.get(p.pid) == p.start
        ]
        children: dict[int, list[int]] = {}
        for p in procs:
            children.setdefault(p.ppid, []).append(p.pid)
        ours: set[int] = set()
        while seeds:
            pid = seeds.pop()
            if pid not in ours:
                ours.add(pid)
                seeds.extend(children.get(pid, ()))
        members = [p for p in procs if p.pid in ours and not p.zombie]
        self._known.update((p.pid, p.start) for p in members)
        return members


def _scan_proc(marker: bytes | None) -> list[_Proc] | None:
    if not os.path.isdir("/proc"):
        return None
    procs = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # Fields after the parenthesised command name, from field 3 (state) on.
            fields = stat[stat.rindex(b")") + 2 :].split()
            zombie = fields[0] in (b"Z", b"X")
            marked = False
            if marker is not None and not zombie:
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        marked = marker in f.read().split(b"\0")
                except PermissionError:
                    pass  # another user's process: not ours
            procs.append(
                _Proc(
                    pid=int(entry),
                    ppid=int(fields[1]),
                    pgid=int(fields[2]),
                    start=int(fields[19]),
                    zombie=zombie,
                    marked=marked,
                )
            )
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return procs


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
