"""Following a job's log: memory of the API process and delay of each line.

Two real jobs on the local target, one after the other, each write a large driver log
(``--mb``, default 100 MB), wait, then print a line with its clock every 0.2 s for a few
seconds. The API runs as one gunicorn process; its resident memory is read from /proc while a
client follows the first job's log from its start with ``logs/?follow=true`` to the job's end,
and, as the baseline of the same run, while a client reads the second job's whole live log at
once with ``logs/`` (what a follower had to do before). Each timed line's delay is the time from
the driver printing it to the follower receiving it.

    .venv/bin/python bench/logs.py [--mb 100]

Goals: following keeps the API's memory flat (growth far below the log's size; the ratio
follow / whole-log read well under 1) and delivers lines within a second (p99).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from common import ROOT, CeleryWorker, bench_workspace, configure, percentile, stop_clusters

TIMED_LINES = 25


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its children (gunicorn's worker), in MB."""
    pids = [pid] + [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    total = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def peak_while(pid: int, work) -> tuple[float, object]:
    """The highest RSS of ``pid`` while ``work()`` runs, and its result."""
    peak, done, result = [rss_mb(pid)], threading.Event(), []

    def sample():
        while not done.is_set():
            peak.append(rss_mb(pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result.append(work())
    finally:
        done.set()
        sampler.join()
    return max(peak), result[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    env = configure("manta_bench_logs", MANTA_FOLLOW_INTERVAL_SECONDS="0.5")
    from workspaces import identity
    from workspaces import services as ws_services

    lines = args.mb * 10_000  # 100-byte lines
    code = (
        "import sys, time; line = 'x' * 99 + '\\n'; "
        f"sys.stdout.writelines(line for _ in range({lines})); sys.stdout.flush(); "
        "time.sleep(15); "
        f"[print('timed', repr(time.time()), flush=True) or time.sleep(0.2) "
        f"for _ in range({TIMED_LINES})]"
    )
    spec = {
        "image": "rayproject/ray:2.60.0",
        "entrypoint": f'python -c "{code}"',
        "head": {"cpu": 1, "memory_gb": 2},
        "worker_groups": [],
        "max_runtime_seconds": 900,
    }
    world = bench_workspace(spec)
    ws = ws_services.workspace_update(
        actor=world["admin"], workspace=world["ws"], data={"approval_policy": "auto"}
    )
    _, token = identity.token_create(actor=world["dev"], user=world["dev"].user)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1",
         "--threads", "4", "--timeout", "900"],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    worker = CeleryWorker(env, concurrency=2, beat=True)
    base = f"http://127.0.0.1:{port}/api/v1/orgs/bench/workspaces/{ws.slug}/jobs/"
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the API did not start")
            time.sleep(0.3)

        def running_job() -> str:
            job = session.post(base, json={"template": world["template"].pk}, timeout=30).json()
            while session.get(f"{base}{job['id']}/", timeout=30).json()["state"] != "running":
                time.sleep(0.5)
            return f"{base}{job['id']}/logs/"

        url = running_job()
        idle = rss_mb(api.pid)
        delays: list[float] = []

        def follow() -> int:
            received, pending = 0, ""
            with session.get(url, params={"follow": "true"}, stream=True, timeout=900) as r:
                for chunk in r.iter_content(chunk_size=None, decode_unicode=True):
                    now = time.time()
                    received += len(chunk)
                    pending += chunk
                    *complete, pending = pending.split("\n")
                    for line in complete:
                        if line.startswith("timed "):
                            delays.append(now - float(line.split()[1]))
            return received

        followed_peak, received = peak_while(api.pid, follow)
        url = running_job()
        time.sleep(10)  # the big part is written
        whole_idle = rss_mb(api.pid)
        whole_peak, whole = peak_while(
            api.pid, lambda: len(session.get(url, timeout=900).json()["logs"])
        )
    finally:
        worker.stop()
        stop_clusters(env["MANTA_LOCAL_RAY_DIR"])
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=30)
    ms = lambda q: percentile(delays, q) * 1000  # noqa: E731
    print(f"log: {whole / 1e6:.0f} MB read whole with logs/ while live; {received / 1e6:.0f} MB "
          "followed with logs/?follow=true to the job's end")  # fmt: skip
    follow_growth, whole_growth = followed_peak - idle, whole_peak - whole_idle
    print(f"API process memory growth: following {follow_growth:.0f} MB (from {idle:.0f} MB); "
          f"baseline, same run, reading the log whole {whole_growth:.0f} MB; ratio "
          f"{follow_growth / max(whole_growth, 1):.2f}")  # fmt: skip
    print(f"line delay, driver print → follower: p50 {ms(50):.0f} ms, p99 {ms(99):.0f} ms "
          f"over {len(delays)} lines (goal: p99 under 1000 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
