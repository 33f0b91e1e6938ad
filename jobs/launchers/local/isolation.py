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
    pids_per_node: int = 1024  # threads count too: an idle Ray head runs about 400
    node_memory_overhead_bytes: int = GIB  # Ray's own processes, per node, above its spec
    default_node_memory_bytes: int = 2 * GIB  # for a node whose spec names no memory
    cgroup_root: str = "/sys/fs/cgroup"
    lease_dir: str = "/var/lib/manta/sandbox-leases"  # one pool of uids and GPUs per host
    egress_allow: tuple[str, ...] = ()  # networks an org admin opened for its target
    default_node_disk_bytes: int = 10 * GIB  # the cluster's disk when its limits name none

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> SandboxSettings:
        raw = dict(config or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in fields}
        for name in ("uid_range", "hide", "gpus", "egress_allow"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    def to_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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


def sandbox_limits(
    settings: SandboxSettings, nodes: list[dict[str, Any]], object_store_bytes: dict[str, int]
) -> dict[str, Any]:
    """The cgroup limits a cluster of ``nodes`` gets: CPU per node (its spec, at least one CPU
    for Ray's own processes), memory for the whole cluster (each node's spec, its object store
    and Ray's overhead), and a process (thread) cap."""
    return {
        "cpu": {n["name"]: max(float(n["num_cpus"]), 1.0) for n in nodes},
        "memory_bytes": sum(
            (n["memory_bytes"] or settings.default_node_memory_bytes)
            + object_store_bytes[n["name"]]
            + settings.node_memory_overhead_bytes
            for n in nodes
        ),
        "pids": settings.pids_per_node * len(nodes),
        "shm_bytes": sum(object_store_bytes.values()) + 64 * MIB,
    }
