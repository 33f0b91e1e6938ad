"""A local cluster's disk: the only storage its nodes may write, of a bounded size and inode
count, so a job that fills it fills its own disk and never the host's.

It is an ext4 filesystem in a sparse image file beside the cluster, loop-mounted (``nosuid``,
``nodev``) on the cluster's writable dir. Why an image and not the alternatives: a size-limited
tmpfs would hold a pip environment or a dataset in RAM (and its pages in the memory limit), and
project quotas need the host's filesystem mounted with ``prjquota``, which the service cannot
assume. An image bounds bytes and inodes on any host filesystem with loop devices, costs
milliseconds to make (lazy inode tables, no journal: the disk lives as long as its cluster), and
uses host space only as the cluster writes. Plain JSON state, so any worker process can destroy
a disk it did not make.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from typing import Any

from ..base import LaunchError
from .isolation import DISK_INODES_PER_GIB, GIB, SYSTEM_PATH

logger = logging.getLogger(__name__)

IMAGE = "disk.img"
MIN_INODES = 4096
# Free space below which a disk counts as full (ext4 keeps a little for its own metadata).
FULL_BYTES = 4 * 1024**2
_ENV = {"PATH": SYSTEM_PATH, "LANG": "C"}


def create(cluster_dir: str, mount_point: str, *, size_bytes: int, inodes: int, owner: int):
    """Make the image, mount it on ``mount_point`` and give its root to ``owner`` (mode 0700).
    Returns the disk's state; LaunchError when the host cannot make it."""
    image = os.path.join(cluster_dir, IMAGE)
    inodes = max(MIN_INODES, inodes or int(size_bytes / GIB * DISK_INODES_PER_GIB))
    state = {"image": image, "mount": mount_point, "bytes": int(size_bytes), "inodes": inodes}
    try:
        with open(image, "wb") as f:
            f.truncate(int(size_bytes))
        _run(
            "mkfs.ext4",
            "-q",
            "-F",
            "-m",
            "0",  # no blocks kept for root: the tenant is never root
            "-N",
            str(inodes),
            "-O",
            "^has_journal",
            "-E",
            f"lazy_itable_init=1,nodiscard,root_owner={owner}:{owner}",
            image,
        )
        _run("mount", "-o", "loop,nosuid,nodev,noatime", image, mount_point)
        state["mounted"] = True
        os.chmod(mount_point, 0o700)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(mount_point, "lost+found"))
    except (OSError, LaunchError) as exc:
        destroy(state)
        raise LaunchError(f"cannot make the cluster's disk: {exc}") from exc
    return state


def full(state: dict[str, Any]) -> bool:
    """The disk has no room left for data or for another file."""
    if not state.get("mounted"):
        return False
    try:
        stats = os.statvfs(state["mount"])
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < FULL_BYTES or stats.f_favail == 0


def describe(state: dict[str, Any]) -> str:
    if not state:
        return ""
    return f"{state['bytes'] / GIB:g} GiB, {state['inodes']} inodes (ext4 image, loop-mounted)"


def full_message(state: dict[str, Any]) -> str:
    return (
        f"the cluster's disk is full ({describe(state)}): raise disk_gb in the job's node "
        "specs, or write less"
    )


def destroy(state: dict[str, Any]) -> bool:
    """Unmount and delete the disk. True when nothing of it is left (so nothing the cluster
    wrote survives it). Idempotent."""
    if not state:
        return True
    mount_point = state.get("mount", "")
    if _mounted(mount_point):
        try:
            _run("umount", mount_point)
        except LaunchError:
            # Still busy (a process of the cluster not yet reaped): detach it now; the kernel
            # frees it with the last reference.
            with contextlib.suppress(LaunchError):
                _run("umount", "-l", mount_point)
    if _mounted(mount_point):
        logger.warning("the cluster disk at %s is still mounted", mount_point)
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state["image"])
    return not os.path.exists(state["image"])


def _mounted(path: str) -> bool:
    if not path:
        return False
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4].encode().decode("unicode_escape") == target for line in f)
    except OSError:
        return False


def _run(*argv: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, env=_ENV, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise LaunchError(f"{' '.join(argv[:2])}: {done.stderr.decode(errors='replace').strip()}")
