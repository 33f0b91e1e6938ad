"""Where a job POST's time goes: cProfile over ``--posts`` submissions through Django's test
client, under the submit benchmark's settings and world (bench/submit.py: DEBUG off, the same
organisation, developer, token and template), after ``--warm`` submissions that are not counted.

    BENCH_SUBMIT_DB=… .venv/bin/python bench/profile_submit.py [--posts 200] [--top 40]

Prints the mean wall time of a job POST and of the bare insert (bench/bare.py), each with the
CPU time this process spent on it (Python: serialisers, the ORM, …) and, with PostgreSQL on
this machine, the CPU time its backend spent on it (the database's side), then the
top entries by cumulative time and by own time. ``--out FILE`` also writes the raw profile (for
pstats, snakeviz, …); ``--sampling`` profiles with pyinstrument instead (a call tree of wall
time; PROFILE_SHOW_ALL=1 shows the libraries' frames too). Run it from the repository's root:
run from bench/, Celery's Django fix-up puts bench/ first on the path, where bench/audit.py
hides the audit app.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

from submit import queue_in_bulk, set_up


def database_cpu() -> tuple[int, float] | None:
    """(pid, seconds of CPU) of this process's PostgreSQL backend, read from /proc: the
    database's share of a request, when the server runs on this machine (else None)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [pid] = cursor.fetchone()
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if not f.read().startswith(b"postgres"):  # the server runs elsewhere: another pid
                return None
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return pid, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--posts", type=int, default=200)
    parser.add_argument("--means-only", action="store_true", help="no profile, the means only")
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", default="")
    parser.add_argument("--queued", type=int, default=0, help="queue this many jobs first (COPY)")
    parser.add_argument(
        "--sampling",
        action="store_true",
        help="profile with pyinstrument (a sampling profiler: no per-call overhead, so the "
        "ORM's many small calls are not inflated) instead of cProfile; it must be importable",
    )
    options = parser.parse_args()
    _, world = set_up()
    if options.queued:
        queue_in_bulk(world, options.queued)
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Bearer {world['token']}")

    def post(path: str = world["path"], body: dict = world["job_body"]) -> None:
        response = client.post(path, body, content_type="application/json")
        assert response.status_code == 201, response.content

    def timed(path: str, body: dict) -> tuple[float, float, float | None]:
        """Mean wall and CPU (this process: Python, not the database) ms of a POST, and the
        CPU ms its PostgreSQL backend spent (None when the server's /proc is not this one's)."""
        for _ in range(options.warm):
            post(path, body)
        backend = database_cpu()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(options.posts):
            post(path, body)
        spent = time.perf_counter() - wall, time.process_time() - cpu
        after = database_cpu()
        database = None
        if backend and after and backend[0] == after[0]:  # the same connection throughout
            database = (after[1] - backend[1]) / options.posts * 1000
        return spent[0] / options.posts * 1000, spent[1] / options.posts * 1000, database

    bare = timed("/bench/bare/", world["bare_body"])
    job = timed(world["path"], world["job_body"])
    # a figure per label, as bench/compare.py reads them
    print(f"mean of {options.posts} POSTs, not profiled")
    for label, (wall, cpu, database) in (("job POST", job), ("bare DRF insert", bare)):
        line = f"{label}: wall {wall:.2f} ms, CPU here {cpu:.2f} ms"
        print(line if database is None else f"{line}, PostgreSQL backend CPU {database:.2f} ms")
    if options.means_only:
        return
    if options.sampling:
        from pyinstrument import Profiler

        sampler = Profiler(interval=0.0005)
        sampler.start()
        for _ in range(options.posts):
            post()
        sampler.stop()
        every_frame = bool(os.environ.get("PROFILE_SHOW_ALL"))  # the libraries' frames too
        print(sampler.output_text(unicode=False, color=False, show_all=every_frame))
        return
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(options.posts):
        post()
    profile.disable()
    if options.out:
        profile.dump_stats(options.out)
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(options.top)
        print(text.getvalue())


if __name__ == "__main__":
    main()
