"""The first process of a local cluster's sandbox, and the door nodes enter it by.

Standard library only: it runs with ``python -I -S`` before anything of Manta could be imported,
and as root until it has built the sandbox.

``init -`` (its config as JSON on stdin) runs as PID 1 of fresh PID, mount, IPC, UTS and
network namespaces (started by ``unshare``). It joins the cluster's cgroups; builds the
cluster's view of the filesystem (every mount read-only; the service's files and secrets
hidden under empty tmpfs; a private ``/tmp``, ``/var/tmp`` and ``/dev/shm``; only the cluster
dir writable); brings the loopback interface up; reports its host pid on ``ready_fd``; drops
to the cluster's uid/gid; and from then on does two things: reaps orphans (it is PID 1) and
forwards connections from the one listening socket it inherited (bound on the host's
127.0.0.1) to the dashboard on the sandbox's own 127.0.0.1. SIGKILL to this process ends the
PID namespace, which ends every process in it.

``enter CONFIG -- COMMAND...`` runs on the host, as root: it moves itself into the cgroups the
config names, then execs COMMAND (``nsenter`` into the namespaces, then ``setpriv`` down to the
cluster's uid, then ``ray start``), so a node and everything it spawns is counted and limited
from its first instruction.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import socket
import struct
import sys
import threading

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CLONE_NEWCGROUP = 0x02000000

_FLAG_NAMES = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
# Pseudo filesystems whose per-mount read-only flag may not be settable; none of them holds
# files a tenant could use to change the host, and /proc is replaced anyway.
_PSEUDO = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "autofs",
    "binfmt_misc",
    "nsfs",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "mqueue",
    "hugetlbfs",
    "fusectl",
    "configfs",
    "efivarfs",
}

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _mountpoints() -> list[tuple[str, str, int]]:
    """(mount point, fs type, per-mount flags) of every mount in this namespace, parents first."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields = left.split()
            point = fields[4].encode().decode("unicode_escape")
            flags = 0
            for name in fields[5].split(","):
                flags |= _FLAG_NAMES.get(name, 0)
            points.append((point, right.split()[0], flags))
    points.sort(key=lambda p: p[0].count("/") if p[0] != "/" else 0)
    return points


def _remount(point: str, flags: int, *, read_only: bool) -> None:
    _mount(None, point, None, MS_BIND | MS_REMOUNT | flags | (MS_RDONLY if read_only else 0))


def _build_filesystem(cfg: dict) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Hold every path we show again before hiding what lies above it.
    exposed = [
        (os.open(source, os.O_PATH | os.O_CLOEXEC), target, writable)
        for source, target, writable in (
            *((p, p, False) for p in cfg.get("expose_ro", [])),
            *((p, p, True) for p in cfg.get("expose_rw", [])),
            *((s, t, False) for s, t in cfg.get("bind_files", {}).items()),
        )
        if os.path.exists(source)
    ]
    for point, fstype, flags in _mountpoints():
        try:
            _remount(point, flags, read_only=True)
        except OSError:
            if fstype not in _PSEUDO:
                raise
    for path in cfg.get("hide", []):
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    inodes = int(cfg.get("scratch_inodes") or 0)
    for path, size in cfg.get("scratch", {}).items():
        if os.path.isdir(path):
            data = f"mode=1777,size={int(size)}" + (f",nr_inodes={inodes}" if inodes else "")
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, data)
    for fd, path, writable in exposed:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        elif not os.path.exists(path):
            open(path, "a").close()
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _remount(path, MS_NOSUID | MS_NODEV, read_only=not writable)
        os.close(fd)
    for device in cfg.get("hide_devices", []):
        if os.path.exists(device):
            _mount("/dev/null", device, None, MS_BIND)
    for path in cfg.get("hide", []):
        # Read-only once the exposed paths are in place; a hidden path that a scratch tmpfs
        # covered is no mount point any more (and root-owned 0755: not writable either).
        with contextlib.suppress(OSError):
            _remount(path, MS_NOSUID | MS_NODEV, read_only=True)
    if os.path.isdir("/dev/mqueue"):
        # This IPC namespace's own queues; without POSIX queues in the kernel, nothing to hide.
        with contextlib.suppress(OSError):
            _mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _private_devpts()
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _private_devpts() -> None:
    """A devpts of the sandbox's own (its ptys neither seen nor counted among the host's)."""
    if not os.path.isdir("/dev/pts") or not os.path.exists("/dev/ptmx"):
        return
    data = "newinstance,ptmxmode=0666,mode=0620,max=256"
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, data)
    _mount("/dev/pts/ptmx", "/dev/ptmx", None, MS_BIND)


def _apply_egress(rules: str) -> None:
    """Load the cluster's egress policy (an nftables script) into its network namespace while
    still root: the tenant's processes have no capability to change it."""
    import subprocess

    subprocess.run(
        ["nft", "-f", "-"],
        input=rules.encode(),
        env={"PATH": "/usr/sbin:/sbin:/usr/bin:/bin"},
        check=True,
        capture_output=True,
        timeout=20,
    )


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(program_hex: str) -> None:
    """Install the sandbox's seccomp filter (a BPF program libseccomp compiled on the host) on
    this thread and everything it starts from now on."""
    program = bytes.fromhex(program_hex)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(
        _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )


def _loopback_up() -> None:
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, siocgifflags, ifreq))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


def _join_cgroups(procs_files: list[str]) -> None:
    for path in procs_files:
        with open(path, "w") as f:
            f.write("0")


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _serve(client: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _forward(listen_fd: int, port: int) -> None:
    listener = socket.socket(fileno=listen_fd)
    while True:
        try:
            client, _ = listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EINTR, errno.ECONNABORTED, errno.EMFILE):
                continue
            raise
        threading.Thread(target=_serve, args=(client, port), daemon=True).start()


def init(cfg: dict) -> None:
    _join_cgroups(cfg.get("cgroup_procs", []))
    # A cgroup namespace rooted here: the cluster sees its own groups' paths, no one else's.
    _check(_libc.unshare(CLONE_NEWCGROUP), "unshare(CLONE_NEWCGROUP)")
    host_pid = int(os.readlink("/proc/self"))  # still the host's /proc: our pid out there
    _build_filesystem(cfg)
    _loopback_up()
    if cfg.get("egress_rules"):
        _apply_egress(cfg["egress_rules"])
    if cfg.get("hostname"):
        name = cfg["hostname"].encode()
        _check(_libc.sethostname(name, len(name)), "sethostname")
    _drop_privileges(cfg["uid"], cfg["gid"])
    if cfg.get("seccomp"):
        load_seccomp(cfg["seccomp"])
    os.write(cfg["ready_fd"], f"{host_pid}\n".encode())
    os.close(cfg["ready_fd"])
    if cfg.get("listen_fd") is not None:
        threading.Thread(
            target=_forward, args=(cfg["listen_fd"], cfg["forward_port"]), daemon=True
        ).start()
    while True:  # PID 1: reap whatever is orphaned here, until killed
        try:
            os.wait()
        except ChildProcessError:
            threading.Event().wait(1.0)
        except InterruptedError:
            continue


def enter(cfg: dict, command: list[str]) -> None:
    _join_cgroups(cfg.get("cgroup_procs", []))
    if cfg.get("seccomp"):
        # Before nsenter and setpriv, so nothing of the node ever runs without it. nsenter's
        # setns is allowed: without capabilities, a tenant's setns joins nothing.
        load_seccomp(cfg["seccomp"])
    os.execvp(command[0], command)


def main(argv: list[str]) -> None:
    mode = argv[1]
    cfg = json.load(sys.stdin) if argv[2] == "-" else json.loads(argv[2])
    if mode == "init":
        try:
            init(cfg)
        except BaseException as exc:
            print(f"sandbox init failed: {exc!r}", file=sys.stderr, flush=True)
            os._exit(70)
    elif mode == "enter":
        if argv[3:4] != ["--"] or len(argv) < 5:
            sys.exit("usage: sandbox_init.py enter CONFIG -- COMMAND...")
        enter(cfg, argv[4:])
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
