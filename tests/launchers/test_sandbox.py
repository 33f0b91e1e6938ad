"""The local launcher's sandbox against real Ray and the host's real cgroups and namespaces:
CPU limits measured from the cgroup's own accounting, physical GPUs handed out disjointly,
Ray's ports kept off the host, and a host that cannot isolate refusing to launch."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.launchers.base import LaunchError, LaunchRequest, launch
from jobs.launchers.local import LocalRayLauncher
from jobs.launchers.local.cgroups import Cgroups
from jobs.launchers.local.isolation import SandboxSettings
from jobs.launchers.local.leases import Leases, take_gpus
from jobs.launchers.local.sandbox import Sandbox
from jobs.launchers.local.startup import listening_in
from tests.launchers.test_local_launcher import spec

# A worker's CPU is measured, and the GPU inventory's devices are leased host-wide.
pytestmark = pytest.mark.whole_host

SPIN = (
    'python -c "import ray, time; ray.init(); '
    "f = ray.remote(num_cpus=1)(lambda: __import__('os').system("
    "'for i in 1 2 3 4; do timeout 20 sh -c \\\"while :; do :; done\\\" & done; wait')); "
    "print('spinning', flush=True); ray.get(f.remote())\""
)


@pytest.fixture(scope="module")
def work_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ms-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def launched() -> Iterator[list[dict[str, Any]]]:
    handles: list[dict[str, Any]] = []
    yield handles
    for handle in handles:
        LocalRayLauncher().stop(handle)


def request(work_dir: str, name: str, job_spec: dict[str, Any], **sandbox: Any) -> LaunchRequest:
    return LaunchRequest(
        submission_id=name,
        cluster_name=f"manta-sandbox-{name}",
        spec=job_spec,
        labels={},
        target_config={"work_dir": work_dir, "sandbox": {"mode": "sandbox", **sandbox}},
    )


def listening_ports() -> set[int]:
    """TCP ports listening in the host's network namespace (IPv4 and IPv6) on sockets this
    process or its descendants hold: what the clusters it launched opened on the host, and
    nothing else the machine runs meanwhile."""
    ours = _socket_inodes(_descendants(os.getpid()))
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in ours:  # LISTEN, on our socket
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


@pytest.mark.ray
def test_a_one_cpu_worker_gets_one_cpu_and_no_ray_port_reaches_the_host(
    work_dir: str, launched: list[dict[str, Any]]
) -> None:
    before = listening_ports()
    launcher = LocalRayLauncher()
    handle = launch(launcher, request(work_dir, "spin", spec(SPIN)))
    launched.append(handle)
    # Only the one forwarded port of the dashboard is new on the host.
    new = listening_ports() - before
    assert new == {int(handle["dashboard_url"].rsplit(":", 1)[1])}, new

    deadline = time.monotonic() + 60
    while "spinning" not in launcher.logs(handle):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    time.sleep(2)  # the four spinners are up
    cgroups = Cgroups(handle["sandbox"]["cgroups"])
    used, started = cgroups.cpu_seconds("w0"), time.monotonic()
    time.sleep(6)
    share = (cgroups.cpu_seconds("w0") - used) / (time.monotonic() - started)
    print(f"a 1-CPU worker spinning 4 processes used {share:.2f} CPU")
    # Four busy processes on a two-core host would take both cores; the quota gives one.
    assert 0.6 < share < 1.25, share
    assert handle["isolation"]["limits"]["cpu"] == {"h": 1.0, "w0": 1.0}

    # Every process of the cluster runs under the seccomp filter, with no_new_privs and no
    # capability; slirp4netns, outside the namespaces, is counted in the cluster's cgroups and
    # runs under a filter of its own.
    sandbox = handle["sandbox"]
    tenant = [
        (pid, status)
        for pid in cgroups.pids() - {sandbox["slirp_pid"]}
        if (status := _status(pid)).get("Uid", "").split()[:1] == [str(sandbox["uid"])]
    ]
    assert len(tenant) > 10  # Ray's processes, the driver and the four spinners
    for pid, status in tenant:
        assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1", (pid, status)
        assert int(status["CapEff"], 16) == 0, (pid, status)
    assert sandbox["slirp_pid"] in cgroups.pids()
    assert _status(sandbox["slirp_pid"])["Seccomp"] == "2"
    assert os.readlink(f"/proc/{sandbox['slirp_pid']}/ns/mnt") != os.readlink("/proc/self/ns/mnt")


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


@pytest.mark.ray
def test_gpus_from_the_inventory_are_leased_disjointly_and_freed(tmp_path) -> None:
    """The grant behind disjoint devices (tests/e2e/test_gpus.py runs it on real clusters):
    all or nothing, under one lock, and free again once released."""
    leases = Leases(str(tmp_path))
    inventory = ("0", "1", "2", "3")
    a = take_gpus(leases, inventory, 2, "cluster-a")
    b = take_gpus(leases, inventory, 2, "cluster-b")
    assert len(a) == len(b) == 2 and not set(a) & set(b)
    with pytest.raises(LaunchError, match="GPUs are busy: 1 needed, 0 of 4 free"):
        take_gpus(leases, inventory, 1, "cluster-c")
    for gpu in a:
        leases.release("gpu", gpu, "cluster-b")  # not its lease: kept
    with pytest.raises(LaunchError, match="busy"):
        take_gpus(leases, inventory, 1, "cluster-c")
    for gpu in a:
        leases.release("gpu", gpu, "cluster-a")
    assert sorted(take_gpus(leases, inventory, 2, "cluster-c")) == sorted(a)
    assert take_gpus(leases, (), 2, "cluster-d") == []  # no inventory: logical GPUs only


def test_a_host_that_cannot_isolate_refuses_to_launch(work_dir: str) -> None:
    req = request(work_dir, "nope", spec("true"), cgroup_root="/nonexistent-cgroups")
    with pytest.raises(LaunchError, match="MANTA_LOCAL_ISOLATION=off"):
        launch(LocalRayLauncher(), req)
    assert not [n for n in os.listdir(work_dir) if n.startswith("mr-")]


def test_a_launch_killed_while_its_sandbox_is_built_leaves_it_findable_and_stoppable(
    work_dir: str,
) -> None:
    """A worker SIGKILLed after the sandbox's cgroups and init exist but before any node
    starts: the cluster's handle already names them, so the sweeps find the cluster and
    stopping it ends the init and removes the cgroups and the dir."""
    req = request(work_dir, "killed-mid-sandbox", spec("true"))
    pid = os.fork()
    if pid == 0:  # the launch, killed right after the sandbox's init has started
        try:
            Sandbox._start_egress = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
            LocalRayLauncher().start_cluster(req)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    [handle] = LocalRayLauncher().find_started(req)
    sandbox = Sandbox(handle["sandbox"])
    assert sandbox.init_alive() and sandbox.state["cgroups"]["dirs"]
    assert not handle["nodes"]
    LocalRayLauncher().stop(handle)
    assert not sandbox.init_alive()
    assert not [d for d in sandbox.state["cgroups"]["dirs"] if os.path.exists(d)]
    assert not os.path.exists(handle["temp_dir"])
    assert LocalRayLauncher().find_started(req) == []


def test_plan_says_what_the_sandbox_enforces() -> None:
    req = request("/tmp", "plan", spec("true"), pids_per_node=500)
    isolation = LocalRayLauncher().plan(req)["isolation"]
    assert isolation["mode"] == "sandbox"
    assert isolation["limits"]["cpu"] == {"h": 1.0, "w0": 1.0}
    assert isolation["limits"]["pids"] == 1000
    gib = 1024**3
    # each node: its spec (1 GiB here), its object store (30 %), Ray's overhead (1 GiB)
    assert isolation["limits"]["memory_bytes"] == 2 * (gib + int(gib * 0.3) + gib)
    off = dataclasses.replace(req, target_config={"sandbox": {"mode": "off"}})
    assert LocalRayLauncher().plan(off)["isolation"]["mode"] == "off"


def test_cgroup_v2_layout(tmp_path) -> None:
    """On a v2 host: one group per cluster (memory, processes, one OOM kill ends it all), a leaf
    per node with its CPU quota, and a leaf for the init (v2 keeps processes in leaves). The
    cgroup filesystem is stood in for by a directory: this host runs v1."""
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    cgroups = Cgroups.create(
        str(tmp_path), "c1", cpus={"h": 1.0, "w0": 2.5}, memory_bytes=3 * 1024**3, pids=2048
    )
    group = tmp_path / "manta" / "c1"
    assert (group / "memory.max").read_text() == str(3 * 1024**3)
    assert (group / "memory.oom.group").read_text() == "1"
    assert (group / "pids.max").read_text() == "2048"
    # While the cluster starts, its nodes share its CPU (1 + 2.5); once up, each has its own.
    assert (group / "cpu.max").read_text() == "350000 100000"
    assert (group / "node-w0" / "cpu.max").read_text() == "max 100000"
    cgroups.settle_cpu()
    assert (group / "node-w0" / "cpu.max").read_text() == "250000 100000"
    assert (group / "node-h" / "cpu.max").read_text() == "100000 100000"
    assert (group / "cpu.max").read_text() == "350000 100000"
    assert cgroups.init_procs() == [str(group / "init" / "cgroup.procs")]
    assert cgroups.node_procs("h") == [str(group / "node-h" / "cgroup.procs")]
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroups.oom_kills() == 1


def test_cgroup_v1_layout_shares_the_clusters_cpu_until_settled(tmp_path) -> None:
    """On a v1 host (this one): the cluster's cpu group is capped at the sum of its nodes'
    quotas; each node's group inherits that cap while the cluster starts, then gets its own.
    The hierarchies are stood in for by directories (the kernel would refuse a node quota
    above its cluster's: every node's is at most the sum)."""
    for controller in ("cpu", "cpuacct", "memory", "pids"):
        (tmp_path / controller).mkdir()
    cgroups = Cgroups.create(
        str(tmp_path), "c1", cpus={"h": 1.0, "w0": 0.5}, memory_bytes=1024**3, pids=512
    )
    cluster = tmp_path / "cpu" / "manta" / "c1"
    assert (cluster / "cpu.cfs_quota_us").read_text() == "150000"
    assert (cluster / "h" / "cpu.cfs_quota_us").read_text() == "-1"
    cgroups.settle_cpu()
    assert (cluster / "h" / "cpu.cfs_quota_us").read_text() == "100000"
    assert (cluster / "w0" / "cpu.cfs_quota_us").read_text() == "50000"
    assert (cluster / "cpu.cfs_quota_us").read_text() == "150000"
    assert (tmp_path / "pids" / "manta" / "c1" / "pids.max").read_text() == "512"


def test_a_port_listening_in_another_network_namespace_is_seen_there_only() -> None:
    """How a sandboxed head's GCS is known to be up: its port in the socket table of the
    sandbox's network namespace, which the host's own does not show."""
    listener = (
        "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 46123)); s.listen(); "
        "print('up', flush=True); sys.stdin.read()"
    )
    process = subprocess.Popen(
        ["unshare", "--net", sys.executable, "-c", listener],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout.readline() == b"up\n"
        assert listening_in(process.pid, 46123)
        assert not listening_in(process.pid, 46124)
        assert not listening_in(os.getpid(), 46123)
    finally:
        process.stdin.close()
        process.wait(timeout=10)
    assert not listening_in(process.pid, 46123)  # gone with its process


def test_settings_round_trip() -> None:
    settings = SandboxSettings(uid_range=(5, 9), gpus=("1",), hide=("/srv/x",))
    assert SandboxSettings.from_config(settings.to_config()) == settings


def test_a_flavored_node_is_planned_and_leased_only_devices_of_its_flavor(tmp_path) -> None:
    """With a typed inventory (h100: 0, 1; a100: 2, 3; untyped: 4), an h100 attempt's GPU
    nodes take only h100 devices and advertise Ray's accelerator_type:H100; a node without
    GPUs gets neither. (tests/e2e/test_gpus.py sees the devices from inside real clusters.)"""
    from jobs.launchers.local.sandbox import _inventory_for

    typed = {
        "gpus": ("0", "1", "2", "3", "4"),
        "gpu_flavors": (("0", "h100"), ("1", "h100"), ("2", "a100"), ("3", "a100")),
    }
    groups = [{"name": "g", "replicas": 2, "cpu": 0, "memory_gb": 1, "gpu": 1}]
    req = dataclasses.replace(
        request("/tmp", "flavor", spec("true", groups), **typed), gpu_flavor="h100"
    )
    head, *workers = LocalRayLauncher().plan(req)["nodes"]
    assert "gpu_flavor" not in head and "accelerator_type:H100" not in head["resources"]
    assert all(w["gpu_flavor"] == "h100" for w in workers)
    assert all(w["resources"] == {"accelerator_type:H100": 1} for w in workers)

    settings = SandboxSettings.from_config(req.target_config["sandbox"])
    assert SandboxSettings.from_config(settings.to_config()) == settings
    leases = Leases(str(tmp_path))
    taken = [
        take_gpus(leases, _inventory_for(settings, w), 1, f"c{i}") for i, w in enumerate(workers)
    ]
    assert sorted(d for devices in taken for d in devices) == ["0", "1"]
    with pytest.raises(LaunchError, match="GPUs are busy"):  # h100 full; a100 is never taken
        take_gpus(leases, _inventory_for(settings, workers[0]), 1, "c9")
    assert _inventory_for(settings, {"num_gpus": 1}) == ("4",)  # untyped: the untyped devices
    with pytest.raises(LaunchError, match="no GPU flavor l4"):
        _inventory_for(settings, {"num_gpus": 1, "gpu_flavor": "l4"})


def test_a_lease_taker_killed_at_any_moment_leaves_no_lease_that_names_nobody(tmp_path) -> None:
    """A lease that names no owner is never stale, so its GPU would be lost for good: a taker
    SIGKILLed while it takes one leaves no lease or a whole one."""
    leases, owner = Leases(str(tmp_path)), "/nonexistent/mr-owner"
    for kill_after in (0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.13, 0.21):
        pid = os.fork()
        if pid == 0:  # takes and gives back one GPU until it is killed
            try:
                while True:
                    leases.take("gpu", "0", owner)
                    leases.release("gpu", "0", owner)
            finally:
                os._exit(1)
        time.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for gpu in leases.held("gpu"):
            assert (tmp_path / f"gpu-{gpu}").read_text() == owner, kill_after
    # What an older taker left (a lease with no owner yet) is dropped once it is a minute old,
    # and so is what a killed taker wrote aside; nothing younger is.
    long_ago = time.time() - 120
    for name in ("gpu-7", ".partial-x"):
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (long_ago, long_ago))
    (tmp_path / "gpu-8").write_text("")
    leases.drop_stale("gpu")
    assert leases.held("gpu") <= {"0", "8"} and "8" in leases.held("gpu")
    assert not (tmp_path / ".partial-x").exists()
