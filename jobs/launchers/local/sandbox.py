"""A local cluster's sandbox, seen from the host: what it enforces, how it starts, how it ends.

Every node of a sandboxed cluster runs

* as the cluster's own unprivileged uid/gid, taken from ``uid_range`` and never shared by two
  live clusters (so no cluster can read, signal or trace another's processes or files, nor the
  service's);
* in the cluster's PID, mount, IPC, UTS and network namespaces, whose first process is
  ``sandbox_init.py`` (see there for the filesystem it builds). The network namespace has only
  loopback, plus ``tap0`` when egress is on: ``slirp4netns --disable-host-loopback`` NATs
  outbound traffic and refuses the host's 127.0.0.0/8. The worker reaches the dashboard through
  one socket the init forwards, bound on the host's 127.0.0.1;
* in cgroups (v2 where the host has it, v1 otherwise): one per cluster capping memory and the
  number of processes, one per node capping CPU by CFS quota;
* with only its own GPUs: physical devices from the host's inventory, disjoint between live
  clusters, named in each node's ``CUDA_VISIBLE_DEVICES``; the other ``/dev/nvidiaN`` are
  hidden.

:meth:`Sandbox.destroy` SIGKILLs the init (which ends the PID namespace and so every process in
it, detached ones included), kills what the cgroup still lists, and frees the uid, the GPUs and
the cgroups. The host-side state is plain JSON (:meth:`Sandbox.to_json`) kept in the cluster's
handle, so any worker process on the host can check or destroy a sandbox it did not start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ..base import LaunchError
from . import disk, egress, seccomp
from .cgroups import Cgroups
from .isolation import (
    ENTERED_NAMESPACES,
    GIB,
    MODE_SANDBOX,
    NAMESPACES,
    NETWORK_LOOPBACK,
    NETWORK_NAT,
    SandboxSettings,
    egress_available,
    sandbox_limits,
)
from .leases import Leases, release_uid, take_gpus, take_uid

logger = logging.getLogger(__name__)

INIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_init.py")
INIT_TIMEOUT = 20.0
KILL_WAIT = 15.0
DRAIN_WAIT = 5.0

# Where hosts keep other users' files, sockets (PostgreSQL's, Docker's) and mounted secrets;
# and every cluster's cgroups (names, memory use).
ALWAYS_HIDDEN = ("/root", "/home", "/run", "/srv", "/mnt", "/media", "/sys/fs/cgroup")
SCRATCH_INODES = 65536  # per private tmpfs: its pages count against the cluster's memory


class Sandbox:
    """One cluster's sandbox. Build it with :meth:`create`, start nodes in it with
    :meth:`node_command`, and end it with :meth:`destroy`."""

    def __init__(self, state: dict[str, Any]):
        self.state = state
        self.cgroups = Cgroups(state.get("cgroups") or {"dirs": [], "nodes": {}, "version": 1})

    def to_json(self) -> dict[str, Any]:
        return self.state

    @classmethod
    def create(
        cls,
        *,
        settings: SandboxSettings,
        work_dir: str,
        cluster_dir: str,
        hostname: str,
        nodes: list[dict[str, Any]],
        object_store_bytes: dict[str, int],
        track: Callable[[subprocess.Popen[bytes]], None],
        save: Callable[[dict[str, Any]], None] = lambda state: None,
    ) -> Sandbox:
        """Allocate a uid, GPUs and cgroups for ``nodes`` (each with ``name``, ``num_cpus``,
        ``num_gpus``, ``memory_bytes``), start the init and, with egress, slirp4netns. The
        cluster's writable dir is ``<cluster_dir>/s``, owned by the sandbox uid.

        ``save`` is given the state after each thing is taken, so that a caller killed midway
        has recorded what :meth:`destroy` must free (the cgroups come before any process, so
        that every process started later is found through them)."""
        owner = os.path.abspath(cluster_dir)  # the leases' owner: gone with the cluster
        leases = Leases(settings.lease_dir)
        state: dict[str, Any] = {
            "work_dir": work_dir,
            "lease_dir": settings.lease_dir,
            "owner": owner,
            "gpus": {},
            "gpu_inventory": list(settings.gpus),
        }
        sandbox = cls(state)
        try:
            uid = take_uid(leases, settings, owner)
            state.update(uid=uid, gid=uid)
            save(state)
            for node in nodes:
                state["gpus"][node["name"]] = take_gpus(
                    leases, _inventory_for(settings, node), node["num_gpus"], owner
                )
                save(state)
            limits = sandbox_limits(settings, nodes, object_store_bytes)
            writable = os.path.join(cluster_dir, "s")
            os.mkdir(writable, 0o700)
            state["writable_dir"] = writable
            # The cluster writes only here: a filesystem image of its own size and inode count.
            state["disk"] = disk.create(
                cluster_dir,
                writable,
                size_bytes=limits["disk_bytes"],
                inodes=limits["inodes"],
                owner=uid,
            )
            save(state)
            sandbox.cgroups = Cgroups.create(
                settings.cgroup_root,
                f"{os.path.basename(cluster_dir)}-{secrets.token_hex(3)}",
                cpus=limits["cpu"],
                memory_bytes=limits["memory_bytes"],
                pids=limits["pids"],
            )
            state["cgroups"] = sandbox.cgroups.state
            state["limits"] = limits
            save(state)
            exit_r = sandbox._start_init(settings, cluster_dir, hostname, track)
            save(state)
            sandbox._start_egress(settings, track, exit_r)
            save(state)
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    def _start_init(
        self, settings: SandboxSettings, cluster_dir: str, hostname: str, track: Callable
    ) -> int:
        """Start the init; returns the read end of the pipe whose write end only the init
        holds (slirp4netns exits when it closes)."""
        state = self.state
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        state["forward_port"] = listener.getsockname()[1]
        state["dashboard_port"] = 8265
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        resolv = os.path.join(cluster_dir, "resolv.conf")
        with open(resolv, "w") as f:
            f.write("nameserver 10.0.2.3\n")  # slirp4netns's DNS forwarder
        hide_devices = [
            f"/dev/nvidia{g}"
            for g in settings.gpus
            if g not in {x for gs in state["gpus"].values() for x in gs}
        ]
        config = {
            "cgroup_procs": self.cgroups.init_procs(),
            "seccomp": seccomp.program().hex(),
            "egress_rules": egress.nft_rules(settings.egress_allow, egress.host_addresses())
            if egress_available(settings)
            else "",
            "uid": state["uid"],
            "gid": state["gid"],
            "hostname": hostname[:63],
            "ready_fd": ready_w,
            "listen_fd": listener.fileno(),
            "forward_port": state["dashboard_port"],
            "hide": [*ALWAYS_HIDDEN, *settings.hide, state["work_dir"]],
            "scratch": {
                "/tmp": 4 * GIB,
                "/var/tmp": 4 * GIB,
                "/dev/shm": state["limits"]["shm_bytes"],
            },
            "scratch_inodes": SCRATCH_INODES,
            "expose_ro": sorted({sys.prefix, sys.base_prefix} - {"/"}),
            "expose_rw": [state["writable_dir"]],
            "bind_files": {resolv: "/etc/resolv.conf"} if egress_available(settings) else {},
            "hide_devices": hide_devices,
        }
        command = [
            "unshare",
            *(f"--{ns}" for ns in NAMESPACES),
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            sys.executable,
            "-I",
            "-S",
            INIT_SCRIPT,
            "init",
            "-",  # the config comes on stdin: a tenant can read its PID 1's command line
        ]
        log_path = os.path.join(cluster_dir, "sandbox.log")
        try:
            with open(log_path, "ab") as log:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={"PATH": os.defpath, "LANG": "C.UTF-8"},
                    pass_fds=(ready_w, listener.fileno(), exit_w),
                    start_new_session=True,
                )
        finally:
            os.close(ready_w)
            os.close(exit_w)
            listener.close()
        track(process)
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(json.dumps(config).encode())
            process.stdin.close()
        state["unshare_pid"] = process.pid
        state["unshare_start"] = process_start_time(process.pid)
        try:
            line = _read_line(ready_r, INIT_TIMEOUT)
        finally:
            os.close(ready_r)
        if not line:
            os.close(exit_r)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
            raise LaunchError(f"the cluster's sandbox did not start:\n{_read_tail(log_path)}")
        state["init_pid"] = int(line)
        state["init_start"] = process_start_time(state["init_pid"])
        return exit_r

    def _start_egress(self, settings: SandboxSettings, track: Callable, exit_r: int) -> None:
        try:
            if not egress_available(settings):
                self.state["network"] = NETWORK_LOOPBACK
                return
            ready_r, ready_w = os.pipe()
            # In the cluster's cgroups (its CPU and memory count against the cluster), in a
            # mount namespace of its own with every capability but NET_BIND_SERVICE dropped,
            # under its own seccomp filter.
            command = [
                *self._enter(self.cgroups.init_procs(), filtered=False),
                "slirp4netns",
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                "--enable-sandbox",
                "--enable-seccomp",
                f"--ready-fd={ready_w}",
                f"--exit-fd={exit_r}",
                str(self.state["init_pid"]),
                "tap0",
            ]
            try:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    pass_fds=(ready_w, exit_r),
                    start_new_session=True,
                )
            finally:
                os.close(ready_w)
            track(process)
            self.state["slirp_pid"] = process.pid
            self.state["slirp_start"] = process_start_time(process.pid)
            try:
                ready = _read_line(ready_r, INIT_TIMEOUT, allow_partial=True)
            finally:
                os.close(ready_r)
            if not ready:
                raise LaunchError("slirp4netns did not configure the sandbox's network")
            self.state["network"] = NETWORK_NAT
            self.state["egress"] = "public internet only" + (
                f", and {', '.join(settings.egress_allow)}" if settings.egress_allow else ""
            )
        finally:
            os.close(exit_r)

    def node_env(self, node: str) -> dict[str, str]:
        """Variables a node gets from the sandbox (its devices, its home)."""
        env = {
            "HOME": self.state["writable_dir"],
            "USER": f"manta{self.state['uid']}",
            "LOGNAME": f"manta{self.state['uid']}",
            "TMPDIR": "/tmp",
        }
        if self.state.get("gpu_inventory"):  # physical GPUs: only this node's (maybe none)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.state["gpus"].get(node) or [])
        return env

    def _enter(self, cgroup_procs: list[str], *, filtered: bool) -> list[str]:
        """The host-side door: join the cgroups (and load the seccomp filter), then exec."""
        config: dict[str, Any] = {"cgroup_procs": cgroup_procs}
        if filtered:
            config["seccomp"] = seccomp.program().hex()
        return [sys.executable, "-I", "-S", INIT_SCRIPT, "enter", json.dumps(config), "--"]

    def node_command(self, node: str, argv: list[str], cwd: str) -> list[str]:
        """``argv`` run as the sandbox uid inside its namespaces and the node's cgroups, under
        the sandbox's seccomp filter."""
        uid, gid = self.state["uid"], self.state["gid"]
        return [
            *self._enter(self.cgroups.node_procs(node), filtered=True),
            "nsenter",
            f"--target={self.state['init_pid']}",
            *(f"--{ns}" for ns in ENTERED_NAMESPACES),
            "--",
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
            "env",
            f"--chdir={cwd}",
            *argv,
        ]

    def init_alive(self) -> bool:
        pid = self.state.get("init_pid")
        return bool(pid) and process_start_time(pid) == self.state.get("init_start")

    def processes(self) -> set[int]:
        return self.cgroups.pids()

    def oom_killed(self) -> bool:
        return self.cgroups.oom_kills() > 0

    def disk_full(self) -> bool:
        return disk.full(self.state.get("disk") or {})

    def summary(self) -> dict[str, Any]:
        """What this sandbox enforces, for the attempt's detail."""
        s = self.state
        return {
            "mode": MODE_SANDBOX,
            "uid": s.get("uid"),
            "gid": s.get("gid"),
            "namespaces": list(ENTERED_NAMESPACES),
            "network": s.get("network", ""),
            "egress": s.get("egress", ""),
            "cgroup": f"v{s.get('cgroups', {}).get('version', '?')}",
            "limits": s.get("limits", {}),
            "gpus": {k: v for k, v in s.get("gpus", {}).items() if v},
            "filesystem": "system read-only; private /tmp, /var/tmp, /dev/shm and devpts; "
            "writable: the cluster's own disk only",
            "disk": disk.describe(s.get("disk") or {}),
            "seccomp": "deny: nested namespaces, mounts, keyrings, bpf, perf_event_open, "
            "userfaultfd, io_uring, AIO, modules, clocks",
        }

    def destroy(self) -> None:
        """End every process of the sandbox and free what it held. Idempotent."""
        s = self.state
        # The sandbox's helpers outside it: unshare (the init's parent) and slirp4netns; then
        # the init, whose death makes the kernel kill every process of its PID namespace.
        for name in ("unshare", "slirp", "init"):
            pid = s.get(f"{name}_pid")
            if pid and process_start_time(pid) == s.get(f"{name}_start"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        # The nodes' host-side parents (nsenter) are in the cgroup too: let them collect their
        # killed children and exit by themselves (killing one first would leave its child a
        # zombie nobody reaps), then kill whatever is still there.
        deadline = time.monotonic() + DRAIN_WAIT
        while self.cgroups.pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        deadline = time.monotonic() + KILL_WAIT
        while True:
            self.cgroups.kill()
            if not self.cgroups.pids() or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        leftover = self.cgroups.pids()
        if leftover:
            logger.warning("sandbox %s: processes survived SIGKILL: %s", s.get("owner"), leftover)
        self.cgroups.remove()
        # Everything the uid could write lies on the cluster's disk (or in its namespaces'
        # tmpfs, gone with them): once the disk is gone, the uid holds no files.
        disk_gone = disk.destroy(s.get("disk") or {})
        # A handle written before leases were per host keeps them under its work dir.
        lease_dir = s.get("lease_dir") or (
            s.get("work_dir") and os.path.join(s["work_dir"], ".sandbox")
        )
        if lease_dir and s.get("owner"):
            leases = Leases(lease_dir)
            for gpus in s.get("gpus", {}).values():
                for gpu in gpus:
                    leases.release("gpu", gpu, s["owner"])
            if s.get("uid") is not None and not leftover and disk_gone:
                release_uid(leases, s["uid"], s["owner"])


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (tells it from a later pid reuse)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _read_line(fd: int, timeout: float, *, allow_partial: bool = False) -> str:
    """Read from ``fd`` until a newline, EOF or the timeout."""
    import select

    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
        if allow_partial and data:
            break
    return data.decode(errors="replace").strip()


def _read_tail(path: str, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-limit:].decode(errors="replace")
    except OSError:
        return ""


def _inventory_for(settings: SandboxSettings, node: dict[str, Any]) -> tuple[str, ...]:
    """The devices a node may be given: those of its GPU flavor (the untyped ones when it has
    none). A host with GPUs but none of that type cannot give it any: admission counts each
    flavor, so this is a setting changed under a job, and the start fails saying so."""
    flavor = node.get("gpu_flavor", "")
    devices = settings.devices_of(flavor) if settings.gpu_flavors else settings.gpus
    if node["num_gpus"] and settings.gpus and not devices:
        kind = f"GPU flavor {flavor}" if flavor else "untyped GPUs"
        raise LaunchError(f"this host has no {kind} (MANTA_LOCAL_GPUS)")
    return devices
