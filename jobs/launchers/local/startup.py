"""Bringing a local cluster up once: its dir, its sandbox, its ports, its nodes (the head
first, then every worker), and the wait until Ray counts every node alive. Whatever fails or is
abandoned on the way is torn down before the error is raised."""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .. import dashboard_http, ray_jobs
from ..base import LaunchAbandoned, LaunchError, LaunchRequest
from . import ports
from .handles import CLUSTER_DIR_PREFIX, KIND, write_handle
from .isolation import MODE_SANDBOX, SandboxSettings, object_store_bytes_for
from .logs import PORT_CONFLICT, RAY_STARTED, log_tail, port_conflict, read_end
from .nodes import node_env, start_node
from .ports import HEAD_PORTS, LOOPBACK, WORKER_PORTS, sandbox_ports
from .processes import child, teardown, track
from .sandbox import Sandbox

logger = logging.getLogger(__name__)


# Longest suffix Ray appends to a node's --temp-dir for a unix socket:
# "/session_2026-01-01_00-00-00_123456_1234567/sockets/plasma_store" is 64 bytes.
_SOCKET_SUFFIX_LEN = 66
_MAX_UNIX_SOCKET_PATH = 107


class Abandon:
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


class PortConflict(LaunchError):
    """A node could not bind one of its ports: retry the whole cluster with fresh ports."""


def start_cluster_once(
    request: LaunchRequest,
    nodes: list[dict[str, Any]],
    base_dir: str,
    timeout: float,
    grace: float,
    object_store_bytes: int | None,
    settings: SandboxSettings,
    abandon: Abandon,
) -> dict[str, Any]:
    """Start the nodes of ``nodes`` (the head first) in a new dir under ``base_dir`` and wait
    until Ray counts them all alive; returns the handle. Raises PortConflict when a node lost
    one of its ports (the caller tries again), LaunchAbandoned when ``abandon`` says so, and
    LaunchError otherwise; in every case what had started is torn down first."""
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
        write_handle(handle)  # from here on, a caller killed at any point leaves it findable
        if sandboxed:
            nodes, stores = sandbox_nodes(settings, nodes, object_store_bytes)

            def save(state: dict[str, Any]) -> None:
                handle["sandbox"] = state
                write_handle(handle)

            sandbox = Sandbox.create(
                settings=settings,
                work_dir=base_dir,
                cluster_dir=cluster_dir,
                hostname=request.cluster_name,
                nodes=nodes,
                object_store_bytes=stores,
                track=track,
                save=save,
            )
            handle["sandbox"] = sandbox.to_json()
            handle["isolation"] = sandbox.summary()
            # Ray's ports live in the sandbox's own network namespace: nothing else binds
            # there, so fixed numbers never collide; the host sees only the forwarded one.
            port_sets = sandbox_ports(len(nodes))
            handle["dashboard_url"] = f"http://{LOOPBACK}:{sandbox.state['forward_port']}"
            env = node_env(token, None)
        else:
            counts = [len(HEAD_PORTS)] + [len(WORKER_PORTS)] * (len(nodes) - 1)
            free = iter(ports.pick_free_ports(sum(counts)))
            port_sets = [{name: next(free) for name in HEAD_PORTS}] + [
                {name: next(free) for name in WORKER_PORTS} for _ in nodes[1:]
            ]
            handle["dashboard_url"] = f"http://{LOOPBACK}:{port_sets[0]['dashboard']}"
            env = node_env(token, cluster_dir)
            stores = dict.fromkeys(names, object_store_bytes)
        handle["gcs_address"] = f"{LOOPBACK}:{port_sets[0]['gcs']}"
        write_handle(handle)

        for number, (name, node, node_ports) in enumerate(
            zip(names, nodes, port_sets, strict=True)
        ):
            abandon.check()
            record = start_node(
                handle, node, name, node_ports, env, stores[name], sandbox, node_root
            )
            handle["nodes"].append(record)
            write_handle(handle)  # now, so that even a crash during start-up leaves it findable
            if number == 0:
                _wait_for_gcs(handle, deadline, abandon)
                logger.debug(
                    "%s: GCS up after %.1fs", request.cluster_name, time.monotonic() - started
                )
            # Workers only need the GCS; starting them all now overlaps their start-up with
            # the head's dashboard coming up.
        wait_for_nodes(handle, len(nodes), deadline, abandon)
        if sandbox is not None:
            sandbox.cgroups.settle_cpu()  # every node up: each to its own quota
    except BaseException:
        teardown(handle)
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


def _node_names(count: int) -> list[str]:
    """A cluster's node names: the head, then its workers (short: they are in socket paths)."""
    return ["h", *(f"w{number}" for number in range(count - 1))]


def sandbox_nodes(
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
        node["name"]: object_store_bytes_for(node["memory_bytes"], object_store_bytes)
        for node in named
    }
    return named, stores


def _wait_for_gcs(handle: dict[str, Any], deadline: float, abandon: Abandon) -> None:
    host, port = handle["gcs_address"].rsplit(":", 1)
    while True:
        _check_nodes_running(handle)
        abandon.check()
        if handle.get("sandbox"):
            # The GCS listens in the sandbox's network only: the kernel's socket table of that
            # namespace (seen through its init) says when, well before `ray start` says so.
            init_pid = handle["sandbox"].get("init_pid")
            if init_pid and listening_in(init_pid, int(port)):
                return
            if RAY_STARTED in read_end(handle["nodes"][0]["log"]):
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
                + log_tail(handle["nodes"][0])
            )
        time.sleep(0.2)


_TCP_LISTEN = "0A"


def listening_in(pid: int, port: int) -> bool:
    """Whether a TCP socket listens on ``port`` in the network namespace of process ``pid``
    (``/proc/<pid>/net/tcp``: that namespace's table, whichever process reads it)."""
    wanted = f":{port:04X}"
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == _TCP_LISTEN and fields[1].endswith(wanted):
                        return True
        except OSError:
            continue
    return False


def wait_for_nodes(
    handle: dict[str, Any], expected: int, deadline: float, abandon: Abandon | None = None
) -> None:
    """Return once the dashboard counts ``expected`` nodes alive; LaunchError when a node died
    or the deadline passed first."""
    url = f"{handle['dashboard_url']}/api/v0/nodes"
    headers = ray_jobs.auth_headers(handle["token"])
    alive = 0
    answered = False
    while True:
        _check_nodes_running(handle)
        if abandon is not None:
            abandon.check()
        try:
            # A cluster adopted after a crash may already run the tenant's code, which may
            # have replaced the dashboard: a bounded exchange, like every other call.
            answer = dashboard_http.exchange(
                "GET", url + "?limit=10000", headers=headers, timeout=5
            )
            if answer.status == 200:
                if not answered:
                    answered = True
                    logger.debug("%s: dashboard answers", handle["cluster_name"])
                listed = json.loads(answer.body)["data"]["result"]["result"]
                alive = sum(1 for n in listed if n.get("state") == "ALIVE")
                if alive >= expected:
                    return
        except (LaunchError, ValueError, KeyError, TypeError, AttributeError):
            pass  # the dashboard is still starting
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"Only {alive} of {expected} Ray nodes were alive after the start timeout\n"
                + "".join(f"=== {n['name']} ===\n{log_tail(n, 15)}" for n in handle["nodes"])
            )
        time.sleep(0.5)


def _check_nodes_running(handle: dict[str, Any]) -> None:
    """Raise if a node died or lost a port race while the cluster is starting."""
    for node in handle["nodes"]:
        process = child(node["pid"])
        if process is not None and process.poll() is not None:
            tail = log_tail(node)
            what = f"Ray {node['role']} node {node['name']} exited during start-up "
            what += f"(exit code {process.returncode})\n{tail}"
            raise (PortConflict if PORT_CONFLICT.search(tail) else LaunchError)(what)
        conflict = port_conflict(node)
        if conflict:
            raise PortConflict(
                f"Ray {node['role']} node {node['name']} could not bind a port: {conflict}"
            )
