"""The uids and physical GPUs of live local clusters: exclusive leases, as files in one directory
per host (``MANTA_LOCAL_LEASE_DIR``) that every worker process sees whatever work dir its target
names, so no two live clusters share a uid or a GPU.

A uid is given to a cluster only while it holds nothing in the kernel: no live process, no key
(``/proc/key-users``; keyrings are per uid, not per namespace, and outlive a cluster), and no
files (the cluster's disk is gone before its uid is released)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
import time
from collections.abc import Callable, Iterator

from ..base import LaunchError
from .files import PARTIAL_PREFIX, write_whole
from .isolation import SandboxSettings

ORPHAN_SECONDS = 60.0


class Leases:
    """Exclusive, cross-process leases (``uid-3000123``, ``gpu-2``) as files in one directory,
    taken under one flock so a multi-GPU grant is all or nothing. Each names its owner: the
    directory of the cluster that holds it."""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fd = os.open(os.path.join(self.dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def held(self, kind: str) -> set[str]:
        return {n.split("-", 1)[1] for n in os.listdir(self.dir) if n.startswith(f"{kind}-")}

    def take(self, kind: str, key: str, owner: str) -> bool:
        """Take the lease unless it is held. It appears with its owner in it
        (:func:`~.files.write_whole`): a taker killed midway leaves no lease or a whole one,
        never one that names nobody and so is never stale."""
        return write_whole(os.path.join(self.dir, f"{kind}-{key}"), owner, exclusive=True)

    def drop_stale(self, kind: str, in_use: Callable[[str], bool] = lambda key: False) -> None:
        """Drop the leases whose owner, a cluster's directory, is gone: a cluster keeps its
        directory from before it takes a lease until after it gives them back, so a lease
        without one was left by a worker that died mid-teardown (or a host that rebooted).
        Also, once a minute old, a lease that names no owner (a taker of an earlier release,
        which wrote the owner after creating the file, died between the two) and what a killed
        taker left aside. A key ``in_use`` says is still in use elsewhere (a uid that still runs
        a process or holds a key) stays leased."""
        old = time.time() - ORPHAN_SECONDS
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            with contextlib.suppress(OSError):
                if name.startswith(PARTIAL_PREFIX):
                    if os.stat(path).st_mtime < old:
                        os.unlink(path)
                    continue
                if not name.startswith(f"{kind}-"):
                    continue
                with open(path) as f:
                    owner = f.read()
                orphaned = (owner.startswith("/") and not os.path.exists(owner)) or (
                    not owner and os.stat(path).st_mtime < old
                )
                if orphaned and not in_use(name.split("-", 1)[1]):
                    os.unlink(path)

    def release(self, kind: str, key: str, owner: str) -> None:
        path = os.path.join(self.dir, f"{kind}-{key}")
        with contextlib.suppress(OSError):
            with open(path) as f:
                if f.read() != owner:
                    return
            os.unlink(path)


def take_uid(leases: Leases, settings: SandboxSettings, owner: str) -> int:
    """A uid of the range that no live cluster holds and that holds nothing in the kernel: no
    process runs as it and it owns no keys. Leases a dead cluster left are dropped first, but
    for a uid that still runs a process or holds a key (its cluster's processes outlived the
    worker that was tearing it down, say)."""
    busy = uids_running() | uids_holding_keys()
    leases.drop_stale("uid", in_use=lambda key: not key.isdigit() or int(key) in busy)
    low, high = settings.uid_range
    for _ in range(1000):
        uid = random.randint(low, high)
        if uid == os.getuid() or uid in busy or _uid_exists(uid):
            continue
        if leases.take("uid", str(uid), owner):
            return uid
    raise LaunchError(f"no free sandbox uid in {low}-{high}")


def release_uid(leases: Leases, uid: int, owner: str) -> None:
    """Give the uid back to the pool, unless the kernel still holds keys for it (then it stays
    leased: no later cluster may read them)."""
    if uid in uids_holding_keys():
        return
    leases.release("uid", str(uid), owner)


# The kernel makes two keyrings for a uid that touches keys (its user and user-session
# keyrings) and keeps them registered after its last process: they count as keys of their own.
OWN_KEYRINGS = 2


def uids_holding_keys() -> set[int]:
    """The uids that own kernel keys beyond their own empty keyrings now (``/proc/key-users``:
    ``uid: usage nkeys/nikeys …``)."""
    found = set()
    try:
        with open("/proc/key-users") as f:
            for line in f:
                uid, _, rest = line.partition(":")
                fields = rest.split()
                if len(fields) >= 2 and int(fields[1].split("/")[0]) > OWN_KEYRINGS:
                    found.add(int(uid))
    except (OSError, ValueError):
        pass
    return found


def uids_running() -> set[int]:
    """The uids any process of the host runs as now (real, effective, saved or filesystem uid;
    ``/proc/<pid>/status``, which shows every PID namespace's processes)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{entry}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    found.update(int(uid) for uid in line.split()[1:])
                    break
    return found


def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def take_gpus(leases: Leases, inventory: tuple[str, ...], count: int, owner: str) -> list[str]:
    if count == 0 or not inventory:
        return []
    with leases.locked():
        leases.drop_stale("gpu")
        free = [g for g in inventory if g not in leases.held("gpu")]
        if len(free) < count:
            raise LaunchError(
                f"the host's GPUs are busy: {count} needed, {len(free)} of {len(inventory)} free"
            )
        chosen = free[:count]
        for gpu in chosen:
            leases.take("gpu", gpu, owner)
    return chosen
