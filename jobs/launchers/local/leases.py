"""The uids and physical GPUs of live local clusters: exclusive leases, as files under the work
dir, that every worker process on the host sees, so no two live clusters share a uid or a GPU."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
from collections.abc import Iterator

from ..base import LaunchError
from .isolation import SandboxSettings


class Leases:
    """Exclusive, cross-process leases (``uid-3000123``, ``gpu-2``) as files under
    ``<work_dir>/.sandbox``, taken under one flock so a multi-GPU grant is all or nothing."""

    def __init__(self, work_dir: str):
        self.dir = os.path.join(work_dir, ".sandbox")
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
        try:
            fd = os.open(
                os.path.join(self.dir, f"{kind}-{key}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
            )
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(owner)
        return True

    def release(self, kind: str, key: str, owner: str) -> None:
        path = os.path.join(self.dir, f"{kind}-{key}")
        with contextlib.suppress(OSError):
            with open(path) as f:
                if f.read() != owner:
                    return
            os.unlink(path)


def take_uid(leases: Leases, settings: SandboxSettings, owner: str) -> int:
    low, high = settings.uid_range
    for _ in range(1000):
        uid = random.randint(low, high)
        if uid == os.getuid() or _uid_exists(uid):
            continue
        if leases.take("uid", str(uid), owner):
            return uid
    raise LaunchError(f"no free sandbox uid in {low}-{high}")


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
        free = [g for g in inventory if g not in leases.held("gpu")]
        if len(free) < count:
            raise LaunchError(
                f"the host's GPUs are busy: {count} needed, {len(free)} of {len(inventory)} free"
            )
        chosen = free[:count]
        for gpu in chosen:
            leases.take("gpu", gpu, owner)
    return chosen
