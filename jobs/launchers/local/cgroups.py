"""A local cluster's cgroups: one per cluster caps its memory and its number of processes, one
per node caps that node's CPU. cgroup v2 where the host has it (one hierarchy; processes only in
leaves), v1 otherwise (a hierarchy per controller). Plain JSON state, so any worker process can
read a cluster's usage or remove its groups.

CPU is capped twice: the cluster's group at the sum of its nodes' quotas, each node's group at
its own. While the cluster starts, the nodes' own caps are lifted (:meth:`Cgroups.settle_cpu`
sets them once every node is up): start-up is Ray's own processes, mostly on the head, and the
head may then use the CPU its workers reserved but do not use yet. The cluster as a whole never
uses more than it reserved, and no tenant code runs before the caps are set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from typing import Any

from ..base import LaunchError

CFS_PERIOD_US = 100_000


@dataclasses.dataclass(frozen=True)
class _CgroupLayout:
    version: int
    # v1: controller name -> its hierarchy's mount; v2: {"": the unified mount}
    mounts: dict[str, str]

    @classmethod
    def detect(cls, root: str) -> _CgroupLayout:
        unified = os.path.join(root, "cgroup.controllers")
        if os.path.exists(unified):
            with open(unified) as f:
                have = set(f.read().split())
            missing = {"cpu", "memory", "pids"} - have
            if missing:
                raise LaunchError(f"cgroup v2 lacks the {sorted(missing)} controllers")
            return cls(2, {"": root})
        mounts = {}
        for controller in ("cpu", "cpuacct", "memory", "pids"):
            path = os.path.join(root, controller)
            if not os.path.isdir(path) or not os.access(path, os.W_OK):
                raise LaunchError(f"no writable cgroup v1 {controller} controller at {path}")
            mounts[controller] = os.path.realpath(path)
        return cls(1, mounts)


class Cgroups:
    """The cgroups of one cluster: ``manta/<id>`` caps memory and processes, and
    ``manta/<id>/<node>`` caps each node's CPU. On v1 each controller is its own hierarchy
    (cpu and cpuacct per node, memory and pids per cluster); on v2 processes live only in
    leaves, so the init gets a leaf of its own."""

    def __init__(self, state: dict[str, Any]):
        self.state = state

    @classmethod
    def create(
        cls, root: str, cluster_id: str, *, cpus: dict[str, float], memory_bytes: int, pids: int
    ) -> Cgroups:
        layout = _CgroupLayout.detect(root)
        state: dict[str, Any] = {"version": layout.version, "dirs": [], "nodes": {}, "caps": {}}
        cg = cls(state)
        try:
            if layout.version == 2:
                cg._create_v2(layout.mounts[""], cluster_id, cpus, memory_bytes, pids)
            else:
                cg._create_v1(layout.mounts, cluster_id, cpus, memory_bytes, pids)
        except OSError as exc:
            cg.remove()
            raise LaunchError(f"cannot set up the cluster's cgroups: {exc}") from exc
        return cg

    def _mkdir(self, path: str) -> str:
        os.makedirs(path, exist_ok=True)
        self.state["dirs"].append(path)
        return path

    def _create_v1(self, mounts, cluster_id, cpus, memory_bytes, pids) -> None:
        def cluster(controller: str) -> str:
            parent = os.path.join(mounts[controller], "manta")
            os.makedirs(parent, exist_ok=True)
            return self._mkdir(os.path.join(parent, cluster_id))

        memory, pid_group = cluster("memory"), cluster("pids")
        cpu, cpuacct = cluster("cpu"), cluster("cpuacct")
        _write(os.path.join(memory, "memory.limit_in_bytes"), memory_bytes)
        with contextlib.suppress(OSError):  # only where the kernel accounts swap
            _write(os.path.join(memory, "memory.memsw.limit_in_bytes"), memory_bytes)
        _write(os.path.join(pid_group, "pids.max"), pids)
        self.state.update(memory=memory, pids=pid_group, init_procs=[], procs_file="cgroup.procs")
        common = [os.path.join(d, "cgroup.procs") for d in {memory, pid_group}]
        self.state["init_procs"] = [
            *common,
            *(os.path.join(d, "cgroup.procs") for d in {cpu, cpuacct}),
        ]
        _write(os.path.join(cpu, "cpu.cfs_period_us"), CFS_PERIOD_US)
        _write(os.path.join(cpu, "cpu.cfs_quota_us"), _quota_us(sum(cpus.values())))
        for node, count in cpus.items():
            node_cpu = self._mkdir(os.path.join(cpu, node))
            node_acct = self._mkdir(os.path.join(cpuacct, node)) if cpuacct != cpu else node_cpu
            _write(os.path.join(node_cpu, "cpu.cfs_period_us"), CFS_PERIOD_US)
            _write(os.path.join(node_cpu, "cpu.cfs_quota_us"), -1)  # the cluster's, until settled
            self.state["caps"][node] = [
                os.path.join(node_cpu, "cpu.cfs_quota_us"),
                str(_quota_us(count)),
            ]
            procs = [*common, *(os.path.join(d, "cgroup.procs") for d in {node_cpu, node_acct})]
            self.state["nodes"][node] = {
                "procs": procs,
                "own": os.path.join(node_cpu, "cgroup.procs"),  # the node's processes only
                "usage": os.path.join(node_acct, "cpuacct.usage"),
            }

    def _create_v2(self, root, cluster_id, cpus, memory_bytes, pids) -> None:
        parent = os.path.join(root, "manta")
        os.makedirs(parent, exist_ok=True)
        for d in (root, parent):
            _write(os.path.join(d, "cgroup.subtree_control"), "+cpu +memory +pids")
        group = self._mkdir(os.path.join(parent, cluster_id))
        _write(os.path.join(group, "memory.max"), memory_bytes)
        with contextlib.suppress(OSError):
            _write(os.path.join(group, "memory.swap.max"), 0)
        _write(os.path.join(group, "memory.oom.group"), 1)  # one OOM kill ends the cluster
        _write(os.path.join(group, "pids.max"), pids)
        _write(os.path.join(group, "cgroup.subtree_control"), "+cpu +memory +pids")
        _write(os.path.join(group, "cpu.max"), f"{_quota_us(sum(cpus.values()))} {CFS_PERIOD_US}")
        init = self._mkdir(os.path.join(group, "init"))
        self.state.update(memory=group, pids=group, init_procs=[os.path.join(init, "cgroup.procs")])
        for node, count in cpus.items():
            leaf = self._mkdir(os.path.join(group, f"node-{node}"))
            _write(os.path.join(leaf, "cpu.max"), f"max {CFS_PERIOD_US}")  # until settled
            self.state["caps"][node] = [
                os.path.join(leaf, "cpu.max"),
                f"{_quota_us(count)} {CFS_PERIOD_US}",
            ]
            self.state["nodes"][node] = {
                "procs": [os.path.join(leaf, "cgroup.procs")],
                "own": os.path.join(leaf, "cgroup.procs"),
                "usage": os.path.join(leaf, "cpu.stat"),
            }

    def settle_cpu(self) -> None:
        """Cap each node at its own CPU quota (until now they shared the cluster's)."""
        try:
            for path, value in self.state.get("caps", {}).values():
                _write(path, value)
        except OSError as exc:
            raise LaunchError(f"cannot cap the cluster's nodes' CPU: {exc}") from exc

    def init_procs(self) -> list[str]:
        return list(self.state["init_procs"])

    def node_procs(self, node: str) -> list[str]:
        return list(self.state["nodes"][node]["procs"])

    def node_pids(self, node: str) -> set[int]:
        """The processes of one node (not those of the whole cluster's groups it is in too)."""
        with contextlib.suppress(OSError), open(self.state["nodes"][node]["own"]) as f:
            return {int(line) for line in f if line.strip()}
        return set()

    def pids(self) -> set[int]:
        """Every process of the cluster (v2: of every leaf under it)."""
        found: set[int] = set()
        top = self.state.get("pids")
        if not top:
            return found
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError), open(os.path.join(dirpath, "cgroup.procs")) as f:
                    found.update(int(line) for line in f if line.strip())
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the cluster's memory."""
        memory = self.state.get("memory")
        if not memory:
            return 0
        name = "memory.events" if self.state["version"] == 2 else "memory.oom_control"
        try:
            with open(os.path.join(memory, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
        return 0

    def cpu_seconds(self, node: str) -> float:
        """CPU time the node's processes have used."""
        path = self.state["nodes"][node]["usage"]
        with open(path) as f:
            text = f.read()
        if self.state["version"] == 2:
            usage = dict(line.split() for line in text.splitlines())
            return int(usage["usage_usec"]) / 1e6
        return int(text) / 1e9

    def kill(self) -> None:
        if self.state["version"] == 2 and self.state.get("pids"):
            with contextlib.suppress(OSError):
                _write(os.path.join(self.state["pids"], "cgroup.kill"), 1)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        for path in reversed(self.state.get("dirs", [])):
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # its last processes are still exiting


def _quota_us(cpus: float) -> int:
    return int(cpus * CFS_PERIOD_US)


def _procs(group: str) -> str:
    return os.path.join(group, "cgroup.procs")


def _write(path: str, value: Any) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def detect_layout(root: str) -> _CgroupLayout:
    """The host's cgroup layout under ``root``; LaunchError naming what is missing."""
    return _CgroupLayout.detect(root)
