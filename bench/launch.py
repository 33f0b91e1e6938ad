"""Approval → running through Manta, against starting the same cluster by hand.

By hand is what a person types: ``ray start --head`` (returns once the head is up), then
``ray start --address=…`` for the worker, then a ``JobSubmissionClient`` submit, waiting until
Ray says RUNNING. Manta does the same work from an approval: admission, the Celery launch task,
head and workers started together, submit, follow. Both clusters: a head with 0 CPUs and one
worker with 1 CPU, token authentication on, every port picked free, on 127.0.0.1.

    .venv/bin/python bench/launch.py [--runs 3]

Manta runs three times per round, each on a fresh worker: cold with the local target's
sandbox (own uid, namespaces, cgroups, slirp4netns), cold without it
(``MANTA_LOCAL_ISOLATION=off``), and warm: sandboxed, from a warm pool of the job's shape
(size 1) whose cluster is idle when the job is approved (``jobs/pools.py``; the pool is sized 0
again, and its clusters stopped, before the next cold run).

Every run starts once no Ray process of an earlier run is left (the by-hand cluster is stopped
by killing its `ray start` sessions whole: Ray renames its agents and workers, and one left
running takes CPU from the runs after it). Prints the medians, the ratios warm / by hand
(goal ≤ 0.3) and cold / by hand (goal ≤ 1.0), and sandbox / off (goal: the sandbox adds ≤ 10 %
to approval → running).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from common import CeleryWorker, bench_workspace, configure, median

ENTRYPOINT = "python -c \"import ray, time; ray.init(); print('up'); time.sleep(2)\""


def ports(count: int) -> list[int]:
    from jobs.launchers.local.ports import pick_free_ports

    return pick_free_ports(count)


def by_hand() -> dict[str, float]:
    """The sequential path, timed step by step."""
    from jobs.launchers import ray_jobs

    base = tempfile.mkdtemp(prefix="bh-", dir="/tmp")
    token = secrets.token_hex(32)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    (
        gcs,
        dash,
        client,
        agent_http,
        agent_grpc,
        metrics,
        runtime_env,
        nm,
        om,
        w_agent_http,
        w_agent_grpc,
        w_metrics,
        w_runtime_env,
        w_nm,
        w_om,
    ) = ports(15)
    ray = str(Path(os.sys.executable).parent / "ray")
    common = [
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
        "--min-worker-port=0",
        "--max-worker-port=0",
    ]
    timings: dict[str, float] = {}
    sessions: list[int] = []  # each `ray start` leads its own session, and its node's processes
    t0 = time.monotonic()
    try:
        start(
            sessions,
            [
                ray,
                "start",
                "--head",
                f"--temp-dir={base}/h",
                f"--port={gcs}",
                "--num-cpus=0",
                f"--dashboard-port={dash}",
                "--dashboard-host=127.0.0.1",
                "--include-dashboard=true",
                f"--ray-client-server-port={client}",
                f"--dashboard-agent-listen-port={agent_http}",
                f"--dashboard-agent-grpc-port={agent_grpc}",
                f"--metrics-export-port={metrics}",
                f"--runtime-env-agent-port={runtime_env}",
                f"--node-manager-port={nm}",
                f"--object-manager-port={om}",
                *common,
            ],
            env,
        )
        timings["head"] = time.monotonic() - t0
        t1 = time.monotonic()
        start(
            sessions,
            [
                ray,
                "start",
                f"--address=127.0.0.1:{gcs}",
                f"--temp-dir={base}/w",
                "--num-cpus=1",
                f"--dashboard-agent-listen-port={w_agent_http}",
                f"--dashboard-agent-grpc-port={w_agent_grpc}",
                f"--metrics-export-port={w_metrics}",
                f"--runtime-env-agent-port={w_runtime_env}",
                f"--node-manager-port={w_nm}",
                f"--object-manager-port={w_om}",
                *common,
            ],
            env,
        )
        timings["worker"] = time.monotonic() - t1
        t2 = time.monotonic()
        client_ = ray_jobs.make_client(f"http://127.0.0.1:{dash}", token)
        sid = client_.submit_job(entrypoint=ENTRYPOINT, entrypoint_num_cpus=0)
        while str(client_.get_job_status(sid)) not in ("JobStatus.RUNNING", "RUNNING"):
            time.sleep(0.05)
        timings["job"] = time.monotonic() - t2
        timings["total"] = time.monotonic() - t0
    finally:
        kill_sessions(sessions)
        shutil.rmtree(base, ignore_errors=True)
    return timings


def start(sessions: list[int], command: list[str], env: dict[str, str]) -> None:
    """Run one `ray start` in a session of its own (noted in ``sessions``) until it returns."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    sessions.append(process.pid)
    output, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"{command[:3]} failed:\n{output.decode(errors='replace')}")


def kill_sessions(sessions: list[int]) -> None:
    """Stop the by-hand cluster without `ray stop` (which would stop every cluster here): every
    process of its `ray start` sessions, until none is left. Matching a path in the command
    line is not enough: Ray renames its agents and workers (``ray::DashboardAgent``), and any
    left running would take CPU from the runs that follow."""
    for _ in range(50):
        members = [pid for pid in _pids() if _session(pid) in sessions]
        if not members:
            return
        for pid in members:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise RuntimeError(f"processes of the by-hand cluster outlived SIGKILL: {members}")


RAY_PROCESS_NAMES = (b"ray::", b"raylet", b"gcs_server", b"/ray/dashboard/", b"slirp4netns")


def wait_quiet(timeout: float = 30) -> None:
    """Every run starts on a machine no earlier run's cluster still takes CPU from: wait until
    no Ray process (nor a sandbox's network helper) is left, and say so if one outlives
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for pid in _pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if any(name in cmdline for name in RAY_PROCESS_NAMES):
                left.append(cmdline.replace(b"\0", b" ")[:80].decode(errors="replace"))
        if not left:
            return
        if time.monotonic() > deadline:
            print(f"warning: {len(left)} Ray processes of earlier runs still run: {left[:3]}")
            return
        time.sleep(0.2)


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _session(pid: int) -> int | None:
    """The session id of ``pid`` (None for a zombie or a process gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[3])


def through_manta(setup) -> dict[str, float]:
    from jobs import services
    from jobs.models import Job, JobAttempt

    job = services.job_submit(actor=setup["dev"], workspace=setup["ws"], template=setup["template"])
    t0 = time.monotonic()
    services.job_approve(actor=setup["admin"], job=job)
    while True:
        state = Job.objects.values_list("state", flat=True).get(pk=job.pk)
        if state == "running":
            break
        if state in ("failed", "cancelled"):
            raise RuntimeError(f"job {job.pk} {state}: {Job.objects.get(pk=job.pk).message}")
        time.sleep(0.02)
    total = time.monotonic() - t0
    attempt = JobAttempt.objects.get(job=job)
    while Job.objects.values_list("state", flat=True).get(pk=job.pk) == "running":
        time.sleep(0.2)  # let it finish and tear down before the next run

    def between(start, end) -> float:
        return (end - start).total_seconds() if start and end else float("nan")

    return {
        "total": total,
        "cluster": between(attempt.created_at, attempt.cluster_ready_at),
        # Where the time went: to the launch task, starting the nodes, submitting, Ray's driver.
        "dispatch": between(attempt.created_at, attempt.launch_started_at),
        "nodes": between(attempt.launch_started_at, attempt.cluster_ready_at),
        "submit": between(attempt.cluster_ready_at, attempt.submitted_at),
        "driver": between(attempt.submitted_at, attempt.running_at),
    }


def pool_sized(setup, size: int) -> None:
    from jobs import pools

    pools.pool_update(actor=setup["admin"], pool=setup["pool"], data={"size": size})


def wait_pool_idle(setup, timeout: float = 180) -> None:
    from jobs.models import WarmCluster

    deadline = time.monotonic() + timeout
    while not WarmCluster.objects.filter(pool=setup["pool"], state="idle").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the warm pool never had an idle cluster")
        time.sleep(0.2)


def drain_pool(setup, timeout: float = 180) -> None:
    """Size 0, and every warm cluster stopped (a refill in progress is let finish first)."""
    from jobs import pool_upkeep
    from jobs.models import WarmCluster

    pool_sized(setup, 0)
    deadline = time.monotonic() + timeout
    live = ("starting", "idle", "retiring")
    while WarmCluster.objects.filter(pool=setup["pool"], state__in=live).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the warm pool did not drain")
        pool_upkeep.pools_reconcile()
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    db = os.environ.get("BENCH_LAUNCH_DB", "manta_bench_launch")  # beside other runs
    env = configure(db, MANTA_FOLLOW_INTERVAL_SECONDS="0.2")
    spec = {
        "image": "rayproject/ray:2.60.0",
        "entrypoint": ENTRYPOINT,
        "head": {"cpu": 0, "memory_gb": 1},
        "worker_groups": [{"name": "w", "replicas": 1, "cpu": 1, "memory_gb": 1}],
    }
    setup = bench_workspace(spec)
    from jobs import pools

    shape = {key: spec[key] for key in ("image", "head", "worker_groups")}
    setup["pool"] = pools.pool_create(
        actor=setup["admin"], organization=setup["ws"].organization, target_name="local",
        spec=shape, size=0,
    )  # fmt: skip
    hand: list[dict[str, float]] = []
    manta: dict[str, list[dict[str, float]]] = {"sandbox": [], "off": [], "warm": []}
    for run in range(args.runs):
        wait_quiet()
        hand.append(by_hand())
        for mode, results in manta.items():
            wait_quiet()
            isolation = "off" if mode == "off" else "sandbox"
            worker = CeleryWorker({**env, "MANTA_LOCAL_ISOLATION": isolation}, concurrency=2)
            try:
                if mode == "warm":
                    pool_sized(setup, 1)
                    wait_pool_idle(setup)  # ahead of need: not part of approval → running
                results.append(through_manta(setup))
            finally:
                if mode == "warm":
                    drain_pool(setup)
                worker.stop()
        print(
            f"run {run + 1}: by hand (cold) {hand[-1]['total']:.2f}s "
            f"(head {hand[-1]['head']:.2f}, worker {hand[-1]['worker']:.2f}, "
            f"job {hand[-1]['job']:.2f}); "
            + "; ".join(
                f"Manta {mode} {r[-1]['total']:.2f}s (dispatch {r[-1]['dispatch']:.2f}, "
                f"nodes {r[-1]['nodes']:.2f}, submit {r[-1]['submit']:.2f}, "
                f"driver {r[-1]['driver']:.2f})"
                for mode, r in manta.items()
            )
        )
    by_hand_median = median([h["total"] for h in hand])
    medians = {mode: median([m["total"] for m in r]) for mode, r in manta.items()}
    print(f"by hand, median of {args.runs}: {by_hand_median:.2f} s")
    for mode, value in medians.items():
        print(f"Manta ({mode}) approval → running, median of {args.runs}: {value:.2f} s")
    ratio = medians["sandbox"] / by_hand_median
    print(f"ratio Manta warm / by hand (cold): {medians['warm'] / by_hand_median:.2f} (goal ≤ 0.3)")
    print(f"ratio Manta cold (sandbox) / by hand (cold): {ratio:.2f} (goal ≤ 1.0)")
    print(f"ratio sandbox / off: {medians['sandbox'] / medians['off']:.2f} (goal ≤ 1.10)")


if __name__ == "__main__":
    main()
