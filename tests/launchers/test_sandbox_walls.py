"""The sandbox's walls one by one, against the real kernel and no Ray: the seccomp filter a
process of a cluster runs under, the disk it writes to, the egress policy its network namespace
loads, and the uid pool that never hands a uid with kernel keys to the next cluster.
(tests/e2e/test_isolation.py tries all of them from inside a real cluster.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from jobs.launchers.base import LaunchError
from jobs.launchers.local import disk, egress, seccomp
from jobs.launchers.local.isolation import SandboxSettings
from jobs.launchers.local.leases import (
    Leases,
    release_uid,
    take_gpus,
    take_uid,
    uids_holding_keys,
)

SANDBOX_INIT = os.path.join(os.path.dirname(seccomp.__file__), "sandbox_init.py")
MIB = 1024**2

# The host's disk is measured before and after, and GPU and uid leases are host-wide.
pytestmark = pytest.mark.whole_host

# Runs as a child: loads the filter the way a node's door does, then tries each call.
FILTERED = textwrap.dedent(
    """
    import ctypes, errno, json, os, sys, threading
    sys.path.insert(0, os.path.dirname(sys.argv[1]))
    import sandbox_init
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS = 38
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    uid = int(sys.argv[3])
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
    sandbox_init.load_seccomp(sys.argv[2])
    calls = {
        "unshare_user": (272, 0x10000000),
        "unshare_net": (272, 0x40000000),
        "clone_newuser": (56, 0x10000000 | 17, 0, 0, 0, 0),
        "add_key": (248, b"user", b"k", b"v", 1, -4),
        "keyctl": (250, 0, -4, 0),
        "bpf": (321, 0, 0, 0),
        "perf_event_open": (298, 0, 0, -1, -1, 0),
        "userfaultfd": (323, 0),
        "io_setup": (206, 1, 0),
        "io_uring_setup": (425, 1, 0),
        "mount": (165, b"none", b"/tmp", b"tmpfs", 0, 0),
        "clock_settime": (227, 0, 0),
        "init_module": (175, 0, 0, b""),
        "clone3": (435, 0, 0),
        # each of these succeeds unfiltered (on itself), so only the filter makes it EPERM
        "ptrace": (101, 0, 0, 0, 0),  # PTRACE_TRACEME
        "process_vm_writev": (311, os.getpid(), 0, 0, 0, 0, 0),
        "pidfd_getfd": (438, 0, 1, 0),
    }
    out = {}
    for name, (nr, *args) in calls.items():
        result = libc.syscall(nr, *args)
        out[name] = errno.errorcode.get(ctypes.get_errno(), "?") if result == -1 else "ALLOWED"
    # what Ray needs still works: a thread, a fork, a file
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    out["fork"] = os.waitpid(pid, 0)[1] >> 8
    print(json.dumps(out))
    """
)


def run_filtered(uid: int = 65534) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-I", "-c", FILTERED, SANDBOX_INIT, seccomp.program().hex(), str(uid)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to another uid")
def test_the_filter_denies_the_kernel_surface_and_leaves_the_rest() -> None:
    out = run_filtered()
    denied = {name: verdict for name, verdict in out.items() if name not in ("clone3", "fork")}
    assert set(denied.values()) == {"EPERM"}, out
    assert out["clone3"] == "ENOSYS", out  # so the C library falls back to clone
    assert out["fork"] == 7


def test_the_filter_is_compiled_by_libseccomp() -> None:
    assert seccomp.available() is None
    program = seccomp.program()
    assert program and len(program) % 8 == 0  # struct sock_filter is 8 bytes


# --- the disk -------------------------------------------------------------------------------


@pytest.fixture
def cluster_dir():
    # Under /tmp, traversable: the tenant's uid writes below it (pytest's tmp_path is 0700).
    path = tempfile.mkdtemp(prefix="mr-disk-", dir="/tmp")
    os.chmod(path, 0o755)
    os.mkdir(os.path.join(path, "s"), 0o700)
    yield path
    disk.destroy({"image": os.path.join(path, disk.IMAGE), "mount": os.path.join(path, "s")})
    shutil.rmtree(path, ignore_errors=True)


def _fill(path: str, uid: int, *, files: bool) -> str:
    """Write as ``uid`` until the disk refuses; the errno it refused with."""
    code = textwrap.dedent(
        f"""
        import errno, os
        os.setresgid({uid}, {uid}, {uid}); os.setresuid({uid}, {uid}, {uid})
        try:
            if {files!r}:
                for i in range(10**7):
                    open(os.path.join({path!r}, f"f{{i}}"), "w").close()
            else:
                with open(os.path.join({path!r}, "big"), "wb") as f:
                    while True:
                        f.write(b"x" * (1 << 20))
                        f.flush()
        except OSError as exc:
            print(errno.errorcode[exc.errno])
        """
    )
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a loop device")
def test_a_cluster_disk_bounds_bytes_and_inodes_and_leaves_the_host_alone(cluster_dir) -> None:
    mount_point = os.path.join(cluster_dir, "s")
    host_before = os.statvfs(cluster_dir)
    state = disk.create(cluster_dir, mount_point, size_bytes=64 * MIB, inodes=4096, owner=65534)
    assert os.stat(mount_point).st_uid == 65534
    assert oct(os.stat(mount_point).st_mode & 0o777) == "0o700"
    assert not disk.full(state)

    assert _fill(mount_point, 65534, files=False) == "ENOSPC"
    assert disk.full(state)
    host_after = os.statvfs(cluster_dir)
    lost = (host_before.f_bavail - host_after.f_bavail) * host_after.f_frsize
    assert lost <= 64 * MIB + 8 * MIB, lost  # the image, never more

    os.unlink(os.path.join(mount_point, "big"))
    assert not disk.full(state)
    assert _fill(mount_point, 65534, files=True) == "ENOSPC"  # out of inodes, not bytes
    assert os.statvfs(mount_point).f_favail == 0 and disk.full(state)
    # The tenant made 4,096 files; the host lost one inode (the image) plus whatever else the
    # machine did meanwhile.
    inodes_lost = host_before.f_favail - os.statvfs(cluster_dir).f_favail
    assert inodes_lost < 1000, inodes_lost

    assert disk.destroy(state)
    assert not os.path.exists(state["image"])
    assert os.listdir(mount_point) == []  # unmounted: the host's empty dir again
    assert disk.destroy(state)  # idempotent


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a loop device")
def test_a_disk_the_host_cannot_make_is_a_launch_error(cluster_dir) -> None:
    with pytest.raises(LaunchError, match="cannot make the cluster's disk"):
        disk.create(cluster_dir, "/nonexistent/mount", size_bytes=64 * MIB, inodes=0, owner=1)
    assert not os.path.exists(os.path.join(cluster_dir, disk.IMAGE))


# --- egress ---------------------------------------------------------------------------------


def test_egress_rules_refuse_private_link_local_and_the_host_but_the_allow_list() -> None:
    rules = egress.nft_rules(["10.213.7.0/24"], ["192.0.2.10", "203.0.113.9", "fd00::2"])
    accept = next(line for line in rules.splitlines() if "10.213.7.0/24" in line)
    assert accept.strip().endswith("accept")
    deny = next(
        line
        for line in rules.splitlines()
        if line.strip().startswith("ip daddr {") and "reject" in line
    )
    for network in (
        "10.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "127.0.0.0/8",
    ):
        assert network in deny
    # the allow-list comes first: nftables takes the first verdict
    assert rules.index("10.213.7.0/24") < rules.index("10.0.0.0/8")


@pytest.mark.skipif(shutil.which("nft") is None or os.geteuid() != 0, reason="needs nft as root")
def test_egress_rules_load_into_a_network_namespace() -> None:
    rules = egress.nft_rules(["10.213.7.0/24", "fd12::/64"], egress.host_addresses())
    done = subprocess.run(
        ["unshare", "--net", "nft", "-f", "-"], input=rules, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


# --- uids -----------------------------------------------------------------------------------


def _keys(uid: int, op: str) -> None:
    """As ``uid`` (unfiltered, like a sandbox without seccomp): add or drop a key in its
    user keyring."""
    code = textwrap.dedent(
        f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        os.setresgid({uid}, {uid}, {uid}); os.setresuid({uid}, {uid}, {uid})
        if {op!r} == "add":
            assert libc.syscall(248, b"user", b"manta-test", b"secret", 6, -4) > 0
        else:
            assert libc.syscall(250, 7, -4) == 0  # KEYCTL_CLEAR the user keyring
        """
    )
    subprocess.run([sys.executable, "-I", "-c", code], check=True, timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="acts as another uid")
def test_a_uid_that_holds_kernel_keys_is_never_handed_out(tmp_path) -> None:
    uid = 3_099_990
    leases = Leases(str(tmp_path))
    _keys(uid, "add")
    try:
        assert uid in uids_holding_keys()
        settings = SandboxSettings(uid_range=(uid, uid))
        with pytest.raises(LaunchError, match="no free sandbox uid"):
            take_uid(leases, settings, "cluster-b")
        assert leases.take("uid", str(uid), "cluster-a")
        release_uid(leases, uid, "cluster-a")
        assert str(uid) in leases.held("uid")  # kept: its keys would reach the next cluster
    finally:
        _keys(uid, "clear")
    deadline = time.monotonic() + 10
    while uid in uids_holding_keys() and time.monotonic() < deadline:
        time.sleep(0.1)  # the kernel collects cleared keys asynchronously
    assert uid not in uids_holding_keys()
    release_uid(leases, uid, "cluster-a")
    assert str(uid) not in leases.held("uid")
    assert take_uid(leases, SandboxSettings(uid_range=(uid, uid)), "cluster-b") == uid


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a loop device")
def test_a_cluster_that_filled_its_disk_fails_disk_full(cluster_dir) -> None:
    """Ray stops answering (or says FAILED) once its disk is full: the attempt says why."""
    from jobs.launchers.local import LocalRayLauncher
    from jobs.launchers.local.sandbox import process_start_time

    mount_point = os.path.join(cluster_dir, "s")
    state = disk.create(cluster_dir, mount_point, size_bytes=64 * MIB, inodes=0, owner=65534)
    assert _fill(mount_point, 65534, files=False) == "ENOSPC"
    handle = {
        "cluster_name": "full",
        "submission_id": "full",
        "temp_dir": cluster_dir,
        "dashboard_url": "http://127.0.0.1:9",  # nothing answers: as a Ray that died of it
        "token": "t",
        "nodes": [],
        "sandbox": {
            "init_pid": os.getpid(),
            "init_start": process_start_time(os.getpid()),
            "cgroups": {"version": 1, "dirs": [], "nodes": {}},
            "disk": state,
        },
    }
    status = LocalRayLauncher().status(handle)
    assert (status.status, status.reason) == ("FAILED", "disk_full")
    assert "the cluster's disk is full (0.0625 GiB" in status.message


def test_a_gpu_lease_whose_cluster_is_gone_is_taken_again(tmp_path) -> None:
    """Leases live per host, beyond any work dir: one left by a worker that died mid-teardown
    (its cluster's directory gone) does not hold the GPU for ever; a live cluster's does."""
    leases = Leases(str(tmp_path / "leases"))
    live, dead = tmp_path / "mr-live", tmp_path / "mr-dead"
    live.mkdir()
    dead.mkdir()
    assert take_gpus(leases, ("0", "1"), 1, str(live)) == ["0"]
    assert take_gpus(leases, ("0", "1"), 1, str(dead)) == ["1"]
    dead.rmdir()
    (tmp_path / "mr-next").mkdir()
    assert take_gpus(leases, ("0", "1"), 1, str(tmp_path / "mr-next")) == ["1"]
    with pytest.raises(LaunchError, match="busy"):
        take_gpus(leases, ("0", "1"), 1, str(tmp_path / "mr-other"))


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a process as another uid")
def test_a_uid_lease_whose_cluster_is_gone_is_dropped_once_the_uid_holds_nothing(
    tmp_path,
) -> None:
    """A worker killed mid-teardown leaves its cluster's uid leased with no cluster: the lease
    is dropped when the next cluster takes a uid, but not while a process still runs as that
    uid (the cluster's processes outlived the worker), and never a live cluster's."""
    uid, settings = 3_099_991, SandboxSettings(uid_range=(3_099_991, 3_099_991))
    leases = Leases(str(tmp_path / "leases"))
    live, dead = tmp_path / "mr-live", tmp_path / "mr-dead"
    live.mkdir()
    assert leases.take("uid", str(uid), str(live))
    with pytest.raises(LaunchError, match="no free sandbox uid"):
        take_uid(leases, settings, str(tmp_path / "mr-next"))  # its cluster lives: kept
    live.rename(dead)  # as if torn down halfway: the lease names a directory that is gone
    survivor = subprocess.Popen(["sleep", "60"], user=uid, group=65534)
    try:
        with pytest.raises(LaunchError, match="no free sandbox uid"):
            take_uid(leases, settings, str(tmp_path / "mr-next"))
        assert str(uid) in leases.held("uid")  # a process still runs as it
    finally:
        survivor.kill()
        survivor.wait()
    assert take_uid(leases, settings, str(tmp_path / "mr-next")) == uid
    assert leases.held("uid") == {str(uid)}
