"""Job submission throughput against a bare DRF insert on the same server, in the same run, at
an empty queue and at a deep one; and deep pages of the job list, by number and by cursor.

    .venv/bin/python bench/submit.py [--queued 100000] [--seconds 8] [--clients 4]

gunicorn serves the API (2 sync workers, DEBUG off, persistent connections) with one extra URL,
a bare DRF endpoint that validates a body and inserts one row (bench/bare.py): the ratio of the
two is what everything a submission does costs (authentication, tenancy, validation, quotas,
the job, its timeline, the audit chain, the outbox). Clients POST as fast as answers come back
for ``--seconds`` each. The statements per POST are counted in this process (Django's test
client, same settings). Then ``--queued`` queued jobs are inserted in bulk (COPY) and it is
measured again, and the job list is read at page 1, at a page number that deep, and by a cursor
at the same depth.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import requests
from common import ROOT, configure


def serve(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{port}",
         "-w", "2", "--timeout", "120"],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"{base}/healthz", timeout=2).ok:
                return api, base
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the API did not start")
        time.sleep(0.3)


def throughput(url: str, body: dict, headers: dict, *, seconds: float, clients: int) -> float:
    """Answered POSTs per second (each must be a 201) from ``clients`` loops."""
    done, stop = [0] * clients, time.monotonic() + seconds

    def loop(index: int) -> None:
        session = requests.Session()
        session.headers.update(headers)
        while time.monotonic() < stop:
            response = session.post(url, json=body, timeout=60)
            if response.status_code != 201:
                raise SystemExit(f"{url}: {response.status_code} {response.text[:300]}")
            done[index] += 1

    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def statements_per_post(path: str, body: dict, token: str) -> tuple[int, int]:
    """SQL statements of one job POST: all, and those other than BEGIN and COMMIT."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    client.post(path, body, content_type="application/json")  # the token's last-used write
    with CaptureQueriesContext(connection) as captured:
        response = client.post(path, body, content_type="application/json")
    assert response.status_code == 201, response.content
    if os.environ.get("BENCH_SHOW_SQL"):
        print("\n".join(query["sql"][:90] for query in captured))
    framing = sum(query["sql"] in ("BEGIN", "COMMIT") for query in captured)
    return len(captured), len(captured) - framing


def latency_ms(session: requests.Session, url: str, params: dict, *, times: int) -> float:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        response = session.get(url, params=params, timeout=120)
        spent.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text[:300]
    return statistics.median(spent)


def queue_in_bulk(world: dict, n: int) -> None:
    from django.db import connection

    from config.db import copy_insert
    from jobs.models import Job, JobState
    from jobs.services import job_prepare

    one = job_prepare(actor=world["dev"], workspace=world["ws"], template=world["template"])
    fields = [f.attname for f in Job._meta.concrete_fields if not f.primary_key]
    for start in range(0, n, 10_000):
        rows = (Job(**{k: getattr(one, k) for k in fields}) for _ in range(min(10_000, n - start)))
        copy_insert(Job, rows)
    assert Job.objects.filter(state=JobState.QUEUED).count() >= n
    # What autovacuum does within a minute of so many new rows: without statistics the planner
    # reads the whole queue for the one-hop bound's LIMIT 17 count (16.7 against 39 ms a POST).
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")


def cursor_at(world: dict, depth: int) -> str:
    """The cursor the list gives out after its first ``depth`` rows (newest first)."""
    from jobs.models import Job

    last = Job.objects.filter(workspace=world["ws"]).order_by("-id").values_list("id", flat=True)
    token = json.dumps({"a": [last[depth - 1]]}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


def set_up() -> tuple[dict[str, str], dict]:
    """The benchmark's database (``BENCH_SUBMIT_DB``, default manta_bench_submit) under its settings
    (``bench/submit_settings.py``, DEBUG off, throttles out of the way), an organisation with a
    developer, a workspace, a template and the developer's token. Returns the server's
    environment and the world: ``dev`` (an Actor), ``ws``, ``template``, ``token``, ``path``
    (the job list's URL path), ``job_body`` and ``bare_body``."""
    fast = "1000000/s"
    env = configure(
        os.environ.get("BENCH_SUBMIT_DB", "manta_bench_submit"),
        DJANGO_SETTINGS_MODULE="submit_settings",
        PYTHONPATH=str(ROOT / "bench"),
        DEBUG="false",
        MANTA_THROTTLE_SUBMIT_USER=fast,
        MANTA_THROTTLE_SUBMIT_WORKSPACE=fast,
        MANTA_THROTTLE_TOKENS=fast,
    )
    from audit.context import Actor
    from jobs import services as job_services
    from jobs.api.examples import COUNTER_SPEC
    from workspaces import identity, services

    system = Actor.system("bench")
    org, owner = services.org_create(actor=system, slug="bench", name="", owner_email="o@b.test")
    dev = services.user_create_in_org(
        actor=system, organization=org, email="d@b.test", password="a-long-password"
    ).user
    ws = services.workspace_create(actor=system, organization=org, slug="w")
    services.member_add(actor=system, workspace=ws, email=dev.email, role="developer")
    template = job_services.template_create(
        actor=Actor.for_user(owner), workspace=ws, name="b", spec=COUNTER_SPEC
    ).template
    _, token = identity.token_create(actor=system, user=dev)
    return env, {
        "dev": Actor.for_user(dev),
        "ws": ws,
        "template": template,
        "token": token,
        "path": f"/api/v1/orgs/bench/workspaces/{ws.slug}/jobs/",
        "job_body": {"template": template.pk},
        "bare_body": {"organization": org.pk, "name": "x"},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=50)
    options = parser.parse_args()
    env, world = set_up()
    token, path = world["token"], world["path"]
    job_body, bare_body = world["job_body"], world["bare_body"]
    auth = {"Authorization": f"Bearer {token}"}
    api, base = serve(env)
    figures: dict[str, float] = {}
    try:
        for label, queued in (("empty queue", 0), (f"{options.queued:,} queued", options.queued)):
            if queued:
                started = time.monotonic()
                queue_in_bulk(world, queued)
                print(f"queued {queued:,} jobs in bulk in {time.monotonic() - started:.1f} s")
            statements, inside = statements_per_post(path, job_body, token)
            run = {"seconds": options.seconds, "clients": options.clients}
            bare = throughput(f"{base}/bench/bare/", bare_body, {}, **run)
            jobs = throughput(f"{base}{path}", job_body, auth, **run)
            figures[label] = jobs
            print(
                f"{label}: job POST {jobs:.1f} req/s, bare DRF insert {bare:.1f} req/s, "
                f"ratio {jobs / bare:.2f}; {statements} SQL statements per job POST "
                f"({inside} and BEGIN, COMMIT)"
            )
        ratio = figures[f"{options.queued:,} queued"] / figures["empty queue"]
        print(f"job POST throughput at {options.queued:,} queued / at an empty queue: {ratio:.2f}")

        session = requests.Session()
        session.headers.update(auth)
        size = options.page_size
        total = session.get(f"{base}{path}", params={"page_size": 1}).json()["count"]
        deep = max(1, total // size - 1)
        depth = (deep - 1) * size
        first = latency_ms(session, f"{base}{path}", {"page_size": size}, times=10)
        numbered = latency_ms(session, f"{base}{path}", {"page": deep, "page_size": size}, times=10)
        cursor = {"cursor": cursor_at(world, depth), "page_size": size}
        by_cursor = latency_ms(session, f"{base}{path}", cursor, times=10)
        rows = session.get(f"{base}{path}", params=cursor).json()["results"]
        same = session.get(f"{base}{path}", params={"page": deep, "page_size": size}).json()
        assert [r["id"] for r in rows] == [r["id"] for r in same["results"]]
        print(f"job list of {total:,} rows, {size} a page (median of 10):")
        print(f"  page 1: {first:.1f} ms")
        print(f"  page {deep:,} by number: {numbered:.1f} ms ({numbered / first:.2f}x page 1)")
        print(f"  the same rows by cursor: {by_cursor:.1f} ms ({by_cursor / first:.2f}x page 1)")
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=30)


if __name__ == "__main__":
    main()
