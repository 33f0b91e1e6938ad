"""A local cluster's nodes one by one: how a node is started (its command, its environment, in
or outside the sandbox), whether it still runs, and starting a dead worker node again (heal)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from typing import Any

from ..base import NodeFailures
from .handles import read_handle, sandbox_of, write_handle
from .ports import LOOPBACK, PORT_FLAGS
from .processes import ClusterProcesses, pid_running, reap, track
from .sandbox import Sandbox, process_start_time

logger = logging.getLogger(__name__)


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


def node_env(token: str, cluster_dir: str | None) -> dict[str, str]:
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


def start_node(
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
    command += [f"{PORT_FLAGS[port]}={number}" for port, number in ports.items()]
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
    track(process)
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


def nodes_running(handle: dict[str, Any]) -> bool:
    """Every node process of the handle still runs (and, in a sandbox, the sandbox too)."""
    sandbox = sandbox_of(handle)
    nodes = handle.get("nodes") or []
    if sandbox is not None:
        return sandbox.init_alive() and all(pid_running(n["pid"]) for n in nodes)
    running = {p.pid for p in ClusterProcesses(handle).members()}
    return all(n["pid"] in running for n in nodes)


def heal_workers(handle: dict[str, Any], *, max_restarts: int) -> list[dict[str, Any]]:
    """Start again, with the same spec, ports and sandbox, every worker node whose process is
    gone; Ray then retries the tasks it lost there. Returns the records of the nodes restarted
    (the handle is updated in place and on disk: the caller stores it).

    A node may be restarted ``max_restarts`` times; one more loss raises NodeFailures. A lost
    head is not healed here: without its GCS the cluster is lost (``status`` says so).
    """
    reap()
    nodes = handle.get("nodes") or []
    sandbox = sandbox_of(handle)
    if not nodes or not _node_alive(nodes[0]):
        return []
    if sandbox is not None and not sandbox.init_alive():
        return []
    restarted = []
    on_disk = read_handle(handle.get("temp_dir", ""))
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
        record = start_node(
            handle,
            {**{k: node[k] for k in ("role", "group", "index") if k in node}, **node["spec"]},
            node["name"],
            node["ports"],
            node_env(handle["token"], None if sandbox else handle["temp_dir"]),
            node.get("object_store_bytes"),
            sandbox,
            os.path.dirname(node["temp_dir"]),
            restarts=restarts,
        )
        nodes[number] = record
        restarted.append(record)
    if restarted:
        write_handle(handle)
    return restarted


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
        pids = {p.pid for p in ClusterProcesses(handle).members() if p.pgid == node["pgid"]}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    reap([node])


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
