"""The local launcher against real Ray: real `ray start` processes, real jobs, no mocks.

One cluster ("A") is shared by most tests to keep the file fast on a small machine; the tests
that need their own cluster start one. Every cluster is stopped in a fixture teardown, so a
failing test leaves no Ray process behind. No database and no Django are needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from jobs.launchers import ray_jobs
from jobs.launchers.base import (
    RAY_FAILED,
    RAY_SUCCEEDED,
    RAY_TERMINAL,
    LaunchError,
    LaunchRequest,
    NodeFailures,
    launch,
)
from jobs.launchers.local import LocalRayLauncher, discover_handles, ports
from jobs.launchers.local.handles import read_handle, write_handle

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT = 90

ACTOR_SCRIPT = """\
import ray

ray.init()


@ray.remote(num_cpus=1, num_gpus=1, resources={"accel": 1})
class Counter:
    def __init__(self):
        self.n = 0

    def incr(self):
        self.n += 1
        return self.n


counter = Counter.remote()
for _ in range(5):
    n = ray.get(counter.incr.remote())
print(f"final count: {n}")
"""


def spec(entrypoint: str, worker_groups: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "image": "rayproject/ray:2.60.0",
        "entrypoint": entrypoint,
        "runtime_env": {"pip": [], "env_vars": {"MANTA_TEST": "1"}, "working_dir": ""},
        "head": {"cpu": 0, "memory_gb": 1, "gpu": 0},
        "worker_groups": worker_groups
        if worker_groups is not None
        else [{"name": "workers", "replicas": 1, "cpu": 1, "memory_gb": 1, "gpu": 0}],
    }


def request(
    submission_id: str,
    job_spec: dict[str, Any],
    work_dir: str,
    cluster_name: str = "",
    isolation: str = "sandbox",
) -> LaunchRequest:
    return LaunchRequest(
        submission_id=submission_id,
        cluster_name=cluster_name or f"manta-test-{submission_id}",
        spec=job_spec,
        labels={"manta.dev/org": "acme", "manta.dev/job": submission_id},
        # Stopping is not what these tests time; a short SIGTERM grace keeps the file fast.
        target_config={
            "work_dir": work_dir,
            "stop_grace_seconds": 1,
            "sandbox": {"mode": isolation},
        },
    )


def for_job(handle: dict[str, Any], submission_id: str) -> dict[str, Any]:
    """The cluster's handle, pointed at another job on the same cluster."""
    return {**handle, "submission_id": submission_id}


def wait_terminal(launcher: LocalRayLauncher, handle: dict[str, Any]) -> Any:
    deadline = time.monotonic() + JOB_TIMEOUT
    while True:
        state = launcher.status(handle)
        if state.status in RAY_TERMINAL:
            return state
        assert time.monotonic() < deadline, f"job still {state.status}"
        time.sleep(0.5)


def processes_with_token(token: str) -> list[int]:
    """Live processes whose environment holds the cluster's token, read straight from /proc."""
    marker = f"RAY_AUTH_TOKEN={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found


def processes_under(path: str) -> list[str]:
    """Command lines of live processes that mention ``path`` (e.g. a cluster's temp dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmdline:
            found.append(f"{entry}: {cmdline[:200]}")
    return found


def assert_nothing_left(handle: dict[str, Any]) -> None:
    for node in handle["nodes"]:
        with pytest.raises(ProcessLookupError):
            os.killpg(node["pgid"], 0)
    assert processes_with_token(handle["token"]) == []
    assert processes_under(handle["temp_dir"]) == []
    assert not os.path.exists(handle["temp_dir"])


@pytest.fixture(scope="module")
def work_dir() -> Iterator[str]:
    # Short on purpose: Ray's unix socket paths live below it and must stay under 108 bytes.
    path = tempfile.mkdtemp(prefix="mt-", dir="/tmp")
    yield path
    leftovers = processes_under(path)
    shutil.rmtree(path, ignore_errors=True)
    assert leftovers == [], "Ray processes outlived the tests"


@pytest.fixture(scope="module")
def launcher() -> LocalRayLauncher:
    return LocalRayLauncher()


@pytest.fixture(scope="module")
def cluster_a(
    launcher: LocalRayLauncher, work_dir: str
) -> Iterator[tuple[dict[str, Any], LaunchRequest]]:
    """Head with 0 CPUs and one worker with 1 CPU, 2 (logical) GPUs and 1 "accel", running a
    job whose Ray actor counts to 5."""
    # The code travels the way Ray ships a working_dir: zipped into the cluster's GCS through
    # the dashboard. The cluster's sandbox cannot read the host's files.
    code = Path(work_dir, "code")
    code.mkdir()
    (code / "count.py").write_text(ACTOR_SCRIPT)
    job_spec = spec(
        "python count.py",
        [
            {
                "name": "gpus",
                "replicas": 1,
                "cpu": 1,
                "memory_gb": 1,
                "gpu": 2,
                "resources": {"accel": 1},
            }
        ],
    )
    job_spec["runtime_env"]["working_dir"] = str(code)
    req = request("a-1", job_spec, work_dir)
    handle = launch(launcher, req)
    yield handle, req
    launcher.stop(handle)


@pytest.fixture
def stop_later(launcher: LocalRayLauncher) -> Iterator[list[dict[str, Any]]]:
    handles: list[dict[str, Any]] = []
    yield handles
    for handle in handles:
        launcher.stop(handle)


# -- no Ray needed ---------------------------------------------------------------------------------


def test_a_writer_killed_while_rewriting_the_handle_leaves_a_whole_one(tmp_path: Path) -> None:
    """The launcher rewrites handle.json after each node starts; a worker SIGKILLed during a
    rewrite must leave a handle the orphan sweeps can read, or its running cluster is lost."""
    handle = {"kind": "local", "temp_dir": str(tmp_path), "nodes": [], "pad": "x" * 400_000}
    write_handle(handle)
    for kill_after in (0.01, 0.03, 0.05, 0.08, 0.13, 0.21):
        pid = os.fork()
        if pid == 0:  # the writer: rewrites until it is killed
            try:
                while True:
                    handle["nodes"].append({"name": "w"})
                    write_handle(handle)
            finally:
                os._exit(1)
        time.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        found = read_handle(str(tmp_path))
        assert found is not None and found["pad"] == handle["pad"], kill_after


def test_plan_lists_every_node_and_the_submission() -> None:
    job_spec = spec(
        "python main.py",
        [
            {"name": "cpu", "replicas": 2, "cpu": 2, "memory_gb": 0.5, "gpu": 0, "disk_gb": 2},
            {"name": "tpu", "replicas": 1, "cpu": 1, "gpu": 1, "resources": {"TPU": 4}},
        ],
    )
    plan = LocalRayLauncher().plan(request("p-1", job_spec, "/tmp"))
    assert plan["kind"] == "local"
    assert plan["cluster_name"] == "manta-test-p-1"
    assert plan["nodes"] == [
        {
            "role": "head",
            "group": "head",
            "num_cpus": 0,
            "num_gpus": 0,
            "memory_bytes": 1024**3,
            "disk_bytes": None,  # the sandbox's default
            "resources": {},
        },
        *[
            {
                "role": "worker",
                "group": "cpu",
                "index": i,
                "num_cpus": 2,
                "num_gpus": 0,
                "memory_bytes": 512 * 1024**2,
                "disk_bytes": 2 * 1024**3,
                "resources": {},
            }
            for i in range(2)
        ],
        {
            "role": "worker",
            "group": "tpu",
            "index": 0,
            "num_cpus": 1,
            "num_gpus": 1,
            "memory_bytes": None,
            "disk_bytes": None,
            "resources": {"TPU": 4},
        },
    ]
    # Empty runtime_env keys are dropped: Ray would set up an empty pip env for "pip": [].
    assert plan["submission"] == {
        "submission_id": "p-1",
        "entrypoint": "python main.py",
        "runtime_env": {"env_vars": {"MANTA_TEST": "1"}},
        "entrypoint_num_cpus": 0,
    }
    json.dumps(plan)


@pytest.mark.parametrize(
    "group",
    [
        {"name": "w", "replicas": 1, "cpu": 0.5},
        {"name": "w", "replicas": 1, "cpu": 1, "gpu": 1.5},
        {"name": "w", "replicas": 1, "cpu": 1, "resources": {"CPU": 1}},
        {"name": "w", "replicas": 1, "cpu": 1, "resources": {"accel": 0.5}},
    ],
)
def test_plan_rejects_what_ray_start_cannot_advertise(group: dict[str, Any]) -> None:
    with pytest.raises(LaunchError):
        LocalRayLauncher().plan(request("p-2", spec("true", [group]), "/tmp"))


# -- real Ray --------------------------------------------------------------------------------------


@pytest.mark.ray
def test_nodes_advertise_exactly_their_spec(cluster_a: tuple[dict[str, Any], Any]) -> None:
    handle, _ = cluster_a
    assert set(handle) >= {
        "dashboard_url",
        "gcs_address",
        "token",
        "nodes",
        "temp_dir",
        "submission_id",
        "cluster_name",
    }
    assert json.loads(json.dumps(handle)) == handle
    r = requests.get(
        f"{handle['dashboard_url']}/api/v0/nodes",
        headers=ray_jobs.auth_headers(handle["token"]),
        timeout=10,
    )
    r.raise_for_status()
    nodes = r.json()["data"]["result"]["result"]
    assert [n["state"] for n in nodes] == ["ALIVE", "ALIVE"]
    head = next(n["resources_total"] for n in nodes if n["is_head_node"])
    worker = next(n["resources_total"] for n in nodes if not n["is_head_node"])
    assert head.get("CPU", 0) == 0
    assert head.get("GPU", 0) == 0
    assert head["memory"] == 1024**3
    assert worker["CPU"] == 1
    assert worker["GPU"] == 2
    assert worker["accel"] == 1
    assert worker["memory"] == 1024**3


@pytest.mark.ray
def test_actor_job_succeeds_and_its_logs_hold_the_count(
    launcher: LocalRayLauncher, cluster_a: tuple[dict[str, Any], Any]
) -> None:
    handle, _ = cluster_a
    state = wait_terminal(launcher, handle)
    logs = launcher.logs(handle)
    assert state.status == RAY_SUCCEEDED, (state, logs)
    assert state.exit_code == 0
    assert "final count: 5" in logs
    assert launcher.logs(handle, tail=1) == "final count: 5\n"
    assert launcher.is_alive(handle)


@pytest.mark.ray
def test_dashboard_refuses_requests_without_the_token(
    cluster_a: tuple[dict[str, Any], Any],
) -> None:
    handle, _ = cluster_a
    jobs_url = f"{handle['dashboard_url']}/api/jobs/"
    assert requests.get(jobs_url, timeout=10).status_code == 401
    wrong = ray_jobs.auth_headers("0" * 64)
    assert requests.get(jobs_url, headers=wrong, timeout=10).status_code == 403
    right = ray_jobs.auth_headers(handle["token"])
    assert requests.get(jobs_url, headers=right, timeout=10).status_code == 200
    with pytest.raises(LaunchError):
        ray_jobs.make_client(handle["dashboard_url"], None)


@pytest.mark.ray
def test_client_talks_to_its_cluster_whatever_ray_address_says(
    cluster_a: tuple[dict[str, Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    handle, _ = cluster_a
    # Ray's JobSubmissionClient would follow these instead of the address it is given.
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:9")
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:9")
    client = ray_jobs.make_client(handle["dashboard_url"], handle["token"])
    assert ray_jobs.job_state(client, handle["submission_id"]).status in RAY_TERMINAL
    assert os.environ["RAY_ADDRESS"] == "http://127.0.0.1:9"


@pytest.mark.ray
def test_failing_entrypoint_ends_failed_with_its_exit_code(
    launcher: LocalRayLauncher, cluster_a: tuple[dict[str, Any], LaunchRequest]
) -> None:
    handle, req = cluster_a
    entrypoint = 'python -c "import sys; sys.exit(3)"'
    failing = dataclasses.replace(req, submission_id="a-fail", spec=spec(entrypoint))
    fail_handle = launcher.submit(for_job(handle, "a-fail"), failing)
    state = wait_terminal(launcher, fail_handle)
    assert state.status == RAY_FAILED
    assert state.message
    assert state.exit_code == 3


@pytest.mark.ray
def test_submitting_again_adopts_the_existing_job(
    launcher: LocalRayLauncher, cluster_a: tuple[dict[str, Any], LaunchRequest]
) -> None:
    handle, req = cluster_a
    again = dataclasses.replace(req, submission_id="a-again", spec=spec("echo once"))
    again_handle = for_job(handle, "a-again")
    launcher.submit(again_handle, again)
    launcher.submit(again_handle, again)
    # As a retried Celery task in another process would: a new launcher, the stored handle.
    LocalRayLauncher().submit(json.loads(json.dumps(again_handle)), again)
    client = launcher.client(handle)
    assert [j.submission_id for j in client.list_jobs()].count("a-again") == 1
    assert wait_terminal(launcher, again_handle).status == RAY_SUCCEEDED
    assert launcher.logs(again_handle).splitlines().count("once") == 1
    # The same id with another entrypoint is someone else's job: refuse, don't adopt.
    other = dataclasses.replace(again, spec=spec("echo twice"))
    with pytest.raises(ray_jobs.JobConflict):
        launcher.submit(again_handle, other)


@pytest.mark.ray
def test_launching_again_adopts_the_running_cluster_and_job(
    cluster_a: tuple[dict[str, Any], LaunchRequest], work_dir: str
) -> None:
    handle, req = cluster_a
    clusters = discover_handles(work_dir)
    # A retried task whose first try died before it could store the handle.
    again = launch(LocalRayLauncher(), req)
    assert again == handle
    assert discover_handles(work_dir) == clusters
    client = ray_jobs.make_client(handle["dashboard_url"], handle["token"])
    assert [j.submission_id for j in client.list_jobs()].count(req.submission_id) == 1


@pytest.mark.ray
def test_node_dying_during_start_up_fails_the_launch_and_cleans_up(
    launcher: LocalRayLauncher, work_dir: str
) -> None:
    before = {h["temp_dir"] for h in discover_handles(work_dir)}
    entries = sorted(os.listdir(work_dir))
    # Ray itself rejects this reserved name when the worker node starts.
    bad = [{"name": "w", "replicas": 1, "cpu": 1, "resources": {"node:__internal_head__": 1}}]
    with pytest.raises(LaunchError) as failure:
        launch(launcher, request("bad-1", spec("true", bad), work_dir))
    assert "worker node" in str(failure.value)
    assert "reserved resource name" in str(failure.value)
    assert {h["temp_dir"] for h in discover_handles(work_dir)} == before
    assert sorted(os.listdir(work_dir)) == entries


@pytest.mark.ray
def test_a_port_taken_before_ray_binds_it_is_retried_with_fresh_ports(
    launcher: LocalRayLauncher,
    work_dir: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    stop_later: list[dict[str, Any]],
) -> None:
    # Fault injection, not a mock: the first cluster really gets a GCS port that another
    # process (this test) listens on, exactly what losing the pick-then-bind race looks like.
    # Only unsandboxed clusters share the host's ports (a sandbox has a network of its own).
    squatter = socket.socket()
    squatter.bind(("", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    pick = ports.pick_free_ports
    calls: list[list[int]] = []

    def pick_then_squat(count: int) -> list[int]:
        ports = pick(count)
        if not calls:
            ports[0] = taken  # the head's GCS port comes first
        calls.append(ports)
        return ports

    monkeypatch.setattr(ports, "pick_free_ports", pick_then_squat)
    before = {h["temp_dir"] for h in discover_handles(work_dir)}
    req = request("retry-1", spec("echo retried", []), work_dir, isolation="off")
    try:
        with caplog.at_level(logging.WARNING, logger="jobs.launchers.local"):
            handle = launch(launcher, req)
    finally:
        squatter.close()
    stop_later.append(handle)
    assert len(calls) == 2
    assert handle["gcs_address"].endswith(f":{calls[1][0]}")
    assert "Address already in use" in caplog.text
    # The first attempt's cluster is gone; only the second one is left.
    assert {h["temp_dir"] for h in discover_handles(work_dir)} - before == {handle["temp_dir"]}
    assert wait_terminal(launcher, handle).status == RAY_SUCCEEDED
    launcher.stop(handle)
    assert_nothing_left(handle)


@pytest.mark.ray
def test_two_clusters_side_by_side_and_stop_from_another_process(
    launcher: LocalRayLauncher,
    cluster_a: tuple[dict[str, Any], LaunchRequest],
    work_dir: str,
    stop_later: list[dict[str, Any]],
) -> None:
    handle_a, req_a = cluster_a
    req_b = request("b-1", spec("sleep 120"), work_dir)
    handle_b = launch(launcher, req_b)
    stop_later.append(handle_b)
    assert handle_b["dashboard_url"] != handle_a["dashboard_url"]
    assert handle_b["token"] != handle_a["token"]
    assert [h["cluster_name"] for h in discover_handles(work_dir)].count("manta-test-b-1") == 1

    slow = dataclasses.replace(req_a, submission_id="a-slow", spec=spec("sleep 8 && echo done"))
    slow_handle = launcher.submit(for_job(handle_a, "a-slow"), slow)
    deadline = time.monotonic() + 30
    while launcher.status(slow_handle).status != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    while launcher.status(handle_b).status != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)

    # Another process, which only has the stored handle, stops cluster B mid-job.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from jobs.launchers.local import LocalRayLauncher\n"
            "LocalRayLauncher().stop(json.load(sys.stdin))\n",
        ],
        input=json.dumps(handle_b),
        text=True,
        cwd=REPO,
        check=True,
        timeout=60,
    )
    assert processes_with_token(handle_b["token"]) == []
    assert processes_under(handle_b["temp_dir"]) == []
    assert not os.path.exists(handle_b["temp_dir"])
    assert launcher.status(slow_handle).status == "RUNNING"

    # Stopping again is a no-op (here it also reaps the node processes, our children).
    launcher.stop(handle_b)
    assert_nothing_left(handle_b)
    assert not launcher.is_alive(handle_b)
    with pytest.raises(LaunchError):
        launcher.status(handle_b)

    state = wait_terminal(launcher, slow_handle)
    assert state.status == RAY_SUCCEEDED
    assert "done" in launcher.logs(slow_handle)


TASKS_SCRIPT = (
    "import ray, time; ray.init(); print('run started', flush=True); "
    "f = ray.remote(num_cpus=1)(lambda i: (time.sleep(1), i)[1]); "
    "refs = [f.remote(i) for i in range(12)]; "
    "[print('task', ray.get(r), flush=True) for r in refs]; print('sum', sum(ray.get(refs)))"
)


def kill_node(node: dict[str, Any]) -> None:
    """SIGKILL every Ray process of one node (its temp dir is on each one's command line); the
    launcher's own wrapper process outside the sandbox sees its child die and exits."""
    pids = [int(line.split(":")[0]) for line in processes_under(node["temp_dir"])]
    pids.remove(node["pid"])
    assert pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def heal_until_restarted(launcher: LocalRayLauncher, handle: dict[str, Any]) -> list[Any]:
    deadline = time.monotonic() + 30
    while not (restarted := launcher.heal(handle, max_restarts=1)):
        assert time.monotonic() < deadline, "the dead node was never started again"
        time.sleep(0.2)
    return restarted


@pytest.mark.ray
def test_a_dead_worker_node_is_started_again_and_the_job_goes_on(
    launcher: LocalRayLauncher, work_dir: str, stop_later: list[dict[str, Any]]
) -> None:
    isolation = "sandbox"  # single-user mode restarts nodes the same way, less the sandbox
    entrypoint = f'python -c "{TASKS_SCRIPT}"'
    req = request(f"heal-{isolation}", spec(entrypoint), work_dir, isolation=isolation)
    handle = launch(launcher, req)
    stop_later.append(handle)
    deadline = time.monotonic() + JOB_TIMEOUT
    while "task 2" not in launcher.logs(handle):
        assert time.monotonic() < deadline, launcher.logs(handle)
        time.sleep(0.2)
    assert launcher.heal(handle, max_restarts=1) == []  # nothing to heal while all run
    dead = handle["nodes"][1]
    stale = json.loads(json.dumps(handle))
    kill_node(dead)
    restarted = heal_until_restarted(launcher, handle)
    assert [(n["name"], n["restarts"]) for n in restarted] == [(dead["name"], 1)]
    node = handle["nodes"][1]
    # A caller that restarted the node but died before storing the handle: the next one finds
    # the restart in the cluster's handle file and adopts it instead of starting another.
    assert launcher.heal(stale, max_restarts=1) == [node] and stale["nodes"][1] == node
    assert node["pid"] != dead["pid"] and node["spec"] == dead["spec"]
    assert node["ports"] == dead["ports"] and node["temp_dir"] != dead["temp_dir"]
    assert discover_handles(work_dir) and [  # the handle on disk is the new one
        h for h in discover_handles(work_dir) if h["nodes"][1]["pid"] == node["pid"]
    ]
    # Ray retries the tasks the dead node held on the new one: the one run finishes.
    state = wait_terminal(launcher, handle)
    logs = launcher.logs(handle)
    assert state.status == RAY_SUCCEEDED, logs
    assert "sum 66" in logs and logs.splitlines().count("run started") == 1
    # A node that dies more often than it may be restarted fails the cluster.
    kill_node(node)
    deadline = time.monotonic() + 30
    with pytest.raises(NodeFailures, match="died 2 times"):
        while time.monotonic() < deadline:
            launcher.heal(handle, max_restarts=1)
            time.sleep(0.2)
    launcher.stop(handle)
    assert_nothing_left(handle)


@pytest.mark.ray
def test_stop_leaves_nothing_behind(
    launcher: LocalRayLauncher, cluster_a: tuple[dict[str, Any], Any]
) -> None:
    handle, _ = cluster_a
    assert processes_with_token(handle["token"])
    launcher.stop(handle)
    assert_nothing_left(handle)
    assert not launcher.is_alive(handle)
    launcher.stop(handle)
    with pytest.raises(LaunchError):
        launcher.logs(handle)
