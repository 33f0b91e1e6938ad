"""A local cluster's processes: the node processes this process started (to reap them), every
process of a cluster found from any process on the host (through /proc), and ending them all.

Processes are only signalled once ``/proc`` shows they are this cluster's (its token in their
environment, or a child or process-group member of such a process), so a stale handle cannot
kill a stranger that reused a pid.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Any

from .handles import sandbox_of
from .sandbox import Sandbox

logger = logging.getLogger(__name__)

DEFAULT_STOP_GRACE = 3.0  # SIGTERM-to-SIGKILL delay when a handle names none
# After SIGKILL, how long to wait for every process to be gone (reaped) before giving up.
KILL_WAIT = 15.0
ZOMBIE_WAIT = 3.0

# Popen objects of nodes this process started, so we can reap them; other processes reap
# nothing (the nodes are not their children) and rely on init instead.
_popens: dict[int, subprocess.Popen[bytes]] = {}
_popens_lock = threading.Lock()


def track(process: subprocess.Popen[bytes]) -> None:
    """Remember a process this process started, to reap it later."""
    with _popens_lock:
        _popens[process.pid] = process


def child(pid: int) -> subprocess.Popen[bytes] | None:
    """The Popen of a node process this process started (None for another's)."""
    with _popens_lock:
        return _popens.get(pid)


def reap(nodes: list[dict[str, Any]] | None = None) -> None:
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


def teardown(handle: dict[str, Any]) -> None:
    """Kill every process of the cluster (worker nodes before the head) and delete its dir.
    Stopping a cluster that is already gone does nothing."""
    reap()
    sandbox = sandbox_of(handle)
    if sandbox is not None:
        _teardown_sandbox(handle, sandbox)
        return
    nodes = handle.get("nodes") or []
    grace = float(handle.get("stop_grace_seconds") or DEFAULT_STOP_GRACE)
    # Worker nodes first, so they do not spend the grace period reconnecting to a dead head.
    ordered = [n for n in nodes if n.get("role") != "head"] + [
        n for n in nodes if n.get("role") == "head"
    ]
    tracker = ClusterProcesses(handle)
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
            reap(nodes)
            time.sleep(0.1)
        reap(nodes)
    leftover = tracker.members()
    if leftover:
        logger.warning(
            "Processes of local Ray cluster %s survived SIGKILL: %s",
            handle.get("cluster_name"),
            [p.pid for p in leftover],
        )
    # Killed processes linger as zombies until reaped: ours by reap, Ray's grandchildren by
    # init. Give that a moment so that the node process groups are really gone on return.
    deadline = time.monotonic() + ZOMBIE_WAIT
    while True:
        reap(nodes)
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
    reap()
    temp_dir = handle.get("temp_dir")
    if temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _group_members(nodes: list[dict[str, Any]], groups: set[int]) -> list[Proc]:
    """Processes (zombies included) still in a node process group that is ours: one this stop
    proved ours, or one with nothing but zombies left (a stranger reusing the pgid would be
    alive)."""
    node_groups = {n["pgid"] for n in nodes}
    procs = _scan_proc(None)
    if procs is None:
        return [
            Proc(pgid, 0, pgid, 0, False, False)
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
class Proc:
    pid: int
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: tells a process from a later one that reuses its pid
    zombie: bool
    marked: bool  # its environment carries this cluster's token


class ClusterProcesses:
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

    def members(self) -> list[Proc]:
        procs = _scan_proc(self._marker)
        if procs is None:
            self.groups = {n["pgid"] for n in self._nodes}
            return [
                Proc(n["pid"], 0, n["pgid"], 0, False, False)
                for n in self._nodes
                if pid_running(n["pid"])
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


def _scan_proc(marker: bytes | None) -> list[Proc] | None:
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
                Proc(
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


def pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
