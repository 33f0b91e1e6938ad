"""Isolation of local clusters, before any sandbox exists: what the operator decided
(:class:`SandboxSettings`), what this host can do (namespaces, cgroups, egress, GPUs), and the
limits a cluster of given nodes gets. ``sandbox.py`` builds the sandbox itself."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from typing import Any

from ..base import LaunchError
from .cgroups import detect_layout

NAMESPACES = ("pid", "mount", "ipc", "uts", "net")  # made by unshare for the init
# Nodes enter the init's cgroup namespace too (it makes that one itself, once in its cgroups).
ENTERED_NAMESPACES = (*NAMESPACES, "cgroup")
MIB = 1024**2
GIB = 1024**3

NETWORK_NAT = "loopback + outbound NAT (slirp4netns, no host loopback)"
NETWORK_LOOPBACK = "loopback only (no egress)"

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

MODE_SANDBOX = "sandbox"
MODE_OFF = "off"


@dataclasses.dataclass(frozen=True)
class SandboxSettings:
    """What the operator decided (never the tenant): read from ``target_config["sandbox"]``."""

    mode: str = MODE_SANDBOX
    uid_range: tuple[int, int] = (3_000_000, 3_099_999)
    egress: bool = True
    hide: tuple[str, ...] = ()  # host paths a sandbox must not see (the service's files)
    gpus: tuple[str, ...] = ()  # the host's GPU inventory: device indices
    # The typed devices' flavors, as (device, flavor) pairs; a device not named is untyped.
    gpu_flavors: tuple[tuple[str, str], ...] = ()
    pids_per_node: int = 1024  # threads count too: an idle Ray head runs about 400
    node_memory_overhead_bytes: int = GIB  # Ray's own processes, per node, above its spec
    default_node_memory_bytes: int = 2 * GIB  # for a node whose spec names no memory
    cgroup_root: str = "/sys/fs/cgroup"
    lease_dir: str = "/var/lib/manta/sandbox-leases"  # one pool of uids and GPUs per host
    egress_allow: tuple[str, ...] = ()  # networks an org admin opened for its target
    default_node_disk_bytes: int = 10 * GIB  # the cluster's disk when its limits name none
    min_node_cpu: float = 1.0  # a node's CPU quota at least: Ray's own processes run on it

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> SandboxSettings:
        raw = dict(config or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in fields}
        for name in ("uid_range", "hide", "gpus", "egress_allow"):
            if name in values:
                values[name] = tuple(values[name])
        if "gpu_flavors" in values:
            values["gpu_flavors"] = tuple(tuple(pair) for pair in values["gpu_flavors"])
        return cls(**values)

    def to_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def devices_of(self, flavor: str) -> tuple[str, ...]:
        """The inventory's devices of ``flavor`` ("": the untyped ones)."""
        typed = dict(self.gpu_flavors)
        return tuple(g for g in self.gpus if typed.get(g, "") == flavor)


def host_support(settings: SandboxSettings) -> list[str]:
    """Why this host cannot build sandboxes (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the worker does not run as root (needed for namespaces and cgroups)")
    for tool, package in (
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
        ("setpriv", "util-linux"),
        ("mount", "mount"),
        ("mkfs.ext4", "e2fsprogs"),
    ):
        if shutil.which(tool, path=SYSTEM_PATH) is None:
            problems.append(f"{tool} ({package}) is not installed")
    if not os.path.exists("/dev/loop-control"):
        problems.append("no loop devices (/dev/loop-control): each cluster's disk is one")
    if settings.egress and shutil.which("nft", path=SYSTEM_PATH) is None:
        problems.append(
            "nft (nftables) is not installed: egress needs it for its policy "
            "(or set MANTA_LOCAL_EGRESS=false)"
        )
    from .seccomp import available as seccomp_problem

    if problem := seccomp_problem():
        problems.append(problem)
    if not problems:
        probe = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount", "--ipc", "--uts", "--net", "true"],
            capture_output=True,
            timeout=10,
        )
        if probe.returncode != 0:
            problems.append(f"cannot create namespaces: {probe.stderr.decode().strip()}")
    try:
        detect_layout(settings.cgroup_root)
    except LaunchError as exc:
        problems.append(str(exc))
    return problems


def egress_available(settings: SandboxSettings) -> bool:
    return (
        settings.egress
        and shutil.which("slirp4netns") is not None
        and os.path.exists("/dev/net/tun")
    )


def detect_gpus() -> tuple[str, ...]:
    """Indices of this host's NVIDIA GPUs (none without ``nvidia-smi``)."""
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


# The inodes of a cluster's disk per GiB of it (ext4's default ratio, 16 KiB a file).
DISK_INODES_PER_GIB = 65536
MIN_OBJECT_STORE_BYTES = 100 * MIB


def object_store_bytes_for(memory_bytes: int, configured: int | None) -> int:
    """A node's object store: the target's setting, else 30 % of the node's memory (Ray's own
    rule), at least 100 MiB."""
    return configured or max(MIN_OBJECT_STORE_BYTES, int(memory_bytes * 0.3))


def enforced_node(
    settings: SandboxSettings,
    *,
    cpu: float,
    memory_bytes: int | None,
    disk_bytes: int | None,
    object_store_bytes: int | None,
) -> dict[str, Any]:
    """What a node's sandbox allows it, from its spec in bytes (None: the spec names none):
    ``cpu`` (its CPU quota: the spec's, at least ``min_node_cpu``), ``memory_bytes`` (the
    spec's memory or the default, its object store and Ray's overhead, all inside the cluster's
    memory limit), ``disk_bytes`` (its share of the cluster's disk) and ``object_store_bytes``.
    The one arithmetic behind both the cgroups (:func:`sandbox_limits`) and what admission
    reserves (:func:`node_footprint`)."""
    memory = memory_bytes or settings.default_node_memory_bytes
    store = object_store_bytes_for(memory, object_store_bytes)
    return {
        "cpu": max(float(cpu), float(settings.min_node_cpu)),
        "memory_bytes": memory + store + settings.node_memory_overhead_bytes,
        "disk_bytes": disk_bytes or settings.default_node_disk_bytes,
        "object_store_bytes": store,
    }


def gb_to_bytes(amount: Any) -> int | None:
    """A spec's GB as bytes, as the launcher reads them (None for none or 0)."""
    number = float(amount or 0)
    return int(number * GIB) if number > 0 else None


def node_footprint(
    settings: SandboxSettings, node: dict[str, Any], object_store_bytes: int | None = None
) -> dict[str, float]:
    """What the sandbox allows a node of spec ``node`` (a job spec's head or worker group:
    ``cpu``, ``memory_gb``, ``disk_gb``), and so what admission reserves for it: ``cpu``,
    ``memory_gb`` and ``disk_gb`` (bytes / 2**30, exact)."""
    enforced = enforced_node(
        settings,
        cpu=float(node.get("cpu") or 0),
        memory_bytes=gb_to_bytes(node.get("memory_gb")),
        disk_bytes=gb_to_bytes(node.get("disk_gb")),
        object_store_bytes=object_store_bytes,
    )
    return {
        "cpu": enforced["cpu"],
        "memory_gb": enforced["memory_bytes"] / GIB,
        "disk_gb": enforced["disk_bytes"] / GIB,
    }


def cluster_footprint(
    settings: SandboxSettings, spec: dict[str, Any], object_store_bytes: int | None = None
) -> dict[str, float]:
    """The sum of :func:`node_footprint` over a job spec's head and every worker replica:
    ``cpu``, ``memory_gb`` and ``disk_gb`` exactly as :func:`sandbox_limits` totals them (a
    whole number of bytes over 2**30 is a float without rounding, and so are their sums)."""
    total = dict.fromkeys(("cpu", "memory_gb", "disk_gb"), 0.0)
    nodes = [(1, spec.get("head") or {})]
    nodes += [(int(g.get("replicas", 1)), g) for g in spec.get("worker_groups") or []]
    for replicas, node in nodes:
        for key, amount in node_footprint(settings, node, object_store_bytes).items():
            total[key] += replicas * amount
    return total


def sandbox_limits(
    settings: SandboxSettings, nodes: list[dict[str, Any]], object_store_bytes: dict[str, int]
) -> dict[str, Any]:
    """The limits a cluster of ``nodes`` (each with ``name``, ``num_cpus``, ``memory_bytes``
    and ``disk_bytes``, None where the spec names none) gets, each node as
    :func:`enforced_node` says: ``cpu`` per node (its cgroup quota), ``memory_bytes`` for the
    whole cluster, ``pids`` (processes and threads), ``shm_bytes`` (its /dev/shm, which holds
    the object stores), ``disk_bytes`` and ``inodes`` of the cluster's disk, and ``nodes``:
    each node's enforced share (``cpu``, ``memory_bytes``, ``disk_bytes``,
    ``object_store_bytes``)."""
    enforced = {
        n["name"]: enforced_node(
            settings,
            cpu=n["num_cpus"],
            memory_bytes=n["memory_bytes"],
            disk_bytes=n.get("disk_bytes"),
            object_store_bytes=object_store_bytes[n["name"]],
        )
        for n in nodes
    }
    disk_bytes = sum(node["disk_bytes"] for node in enforced.values())
    return {
        "cpu": {name: node["cpu"] for name, node in enforced.items()},
        "memory_bytes": sum(node["memory_bytes"] for node in enforced.values()),
        "pids": settings.pids_per_node * len(nodes),
        "shm_bytes": sum(object_store_bytes.values()) + 64 * MIB,
        "disk_bytes": disk_bytes,
        "inodes": int(disk_bytes / GIB * DISK_INODES_PER_GIB),
        "nodes": enforced,
    }
