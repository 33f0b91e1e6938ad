"""A hostile tenant on the `local` target, end to end: real Celery worker, PostgreSQL, Redis and
sandboxed Ray clusters.

Organisation globex submits a job whose entrypoint tries every way out of its cluster that a
shared host offers; organisation acme's job runs beside it. Every attempt must fail, acme's job
must succeed, and after both nothing of either cluster may be left on the host.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
import uuid
import zlib
from pathlib import Path

import pytest

from audit.context import Actor
from config import secrets
from jobs.models import Job, JobAttempt
from tests.e2e.conftest import cluster_processes
from tests.e2e.test_launch import (
    TERMINAL,
    WS,
    make_template,
    py,
    submit,
    wait_for,
    world,  # noqa: F401  (fixture)
)
from workspaces import services as ws_services

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

# Runs in globex's cluster. Each probe prints "BLOCKED <name>" or "ESCAPED <name>: <what>".
PROBE = r"""
import glob, json, os, signal, socket, sys, time

def report(name, escaped, detail=""):
    verdict = "ESCAPED " if escaped else "BLOCKED "
    print(verdict + name + (": " + detail if detail else ""), flush=True)

secrets_seen = []
for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        data = open(path, "rb").read()
    except OSError:
        continue
    for key in (b"DATABASE_URL=", b"SECRET_KEY=", b"MANTA_ENCRYPTION_KEY=", b"CELERY_BROKER_URL="):
        if key in data:
            secrets_seen.append(path + " " + key.decode())
report("service_environ", bool(secrets_seen), ", ".join(secrets_seen))

foreign = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        cmd = open(path, "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if any(word in cmd for word in ("celery", "pytest", "postgres", "redis-server", "manage.py")):
        foreign.append(cmd[:80])
report("foreign_processes", bool(foreign), "; ".join(foreign))

# The service's PostgreSQL, Redis and API on the host's loopback, directly and through the NAT's
# gateway. (The sandbox's own 127.0.0.1 has its own cluster's GCS on 6379: Redis must answer
# PING to count as reached.)
for host, port in [("127.0.0.1", 5432), ("127.0.0.1", 6379), ("127.0.0.1", API_PORT),
                   ("10.0.2.2", 5432), ("10.0.2.2", 6379), ("10.0.2.2", API_PORT)]:
    try:
        with socket.create_connection((host, port), timeout=3) as conn:
            if port == 6379:
                conn.settimeout(3)
                conn.sendall(b"PING\r\n")
                try:
                    answer = conn.recv(64)
                except OSError:
                    answer = b""
                report(f"connect_{host}_{port}", answer.startswith(b"+PONG"), repr(answer[:20]))
            else:
                report(f"connect_{host}_{port}", True)
    except OSError as exc:
        report(f"connect_{host}_{port}", False, type(exc).__name__)

handles = []
for path in glob.glob(WORK_DIR + "/mr-*/handle.json") + [OTHER_DIR + "/handle.json"]:
    try:
        handles.append(path + " " + open(path).read()[:40])
    except OSError:
        pass
report("other_cluster_dir", bool(handles), "; ".join(handles))

written = []
for path in ["/etc/manta-escape", "/usr/manta-escape", "/var/lib/manta-escape",
             WORK_DIR + "/manta-escape", "/root/manta-escape", PROJECT + "/manta-escape"]:
    try:
        with open(path, "w") as f:
            f.write("x")
        written.append(path)
    except OSError:
        pass
open("/tmp/" + MARK, "w").write("x")  # the sandbox's private /tmp: never the host's
report("write_outside", bool(written), ", ".join(written))

children = []
try:
    for _ in range(3000):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    report("fork_cap", True, f"{len(children)} processes")
except OSError as exc:
    report("fork_cap", False, f"fork failed after {len(children)}: {exc}")
for pid in children:
    os.kill(pid, signal.SIGKILL)
for pid in children:
    os.waitpid(pid, 0)

if os.fork() == 0:  # a detached grandchild, in a session of its own: teardown must end it
    os.setsid()
    if os.fork() == 0:
        time.sleep(3600)
    os._exit(0)
print("detached process left", flush=True)

print("allocating past the memory limit", flush=True)
chunks = []
while True:
    chunks.append(bytearray(256 * 1024 * 1024))
    print("allocated", len(chunks) * 256, "MiB", flush=True)
"""

BENIGN = py(
    "import ray, time; ray.init(); "
    "print('acme sum', sum(ray.get([ray.remote(lambda i: i * i).remote(i) for i in range(20)]))); "
    "time.sleep(12); print('acme done')"
)


def probe_entrypoint(**values: object) -> str:
    code = PROBE
    for name, value in values.items():
        code = code.replace(name, repr(value))
    encoded = base64.b64encode(zlib.compress(code.encode(), 9)).decode()  # entrypoints are short
    return py(f"import base64, zlib; exec(zlib.decompress(base64.b64decode('{encoded}')))")


def sandbox_uid(attempt: JobAttempt) -> int:
    return attempt.isolation["uid"]


def processes_of_uid(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_hostile_job_reaches_nothing_while_its_neighbour_runs(world, ray_work_dir):  # noqa: F811
    api = socket.socket()  # stands for the API: a service on the host's loopback
    api.bind(("127.0.0.1", 0))
    api.listen()
    api_port = api.getsockname()[1]
    mark = f"manta-escape-{uuid.uuid4().hex}"

    acme_template = make_template(world, entrypoint=BENIGN)
    acme_job = submit(world, acme_template)
    wait_for(acme_job, {"running"})
    acme_attempt = JobAttempt.objects.get(job_id=acme_job)
    acme_dir = secrets.decrypt_json(acme_attempt.handle_encrypted)["temp_dir"]

    owner = world.users["foreign"]
    ws_services.workspace_create(
        actor=Actor.for_user(owner), organization=world.other_org, slug="lab", name="Lab"
    )
    globex = world.client("foreign")
    base = "/api/v1/orgs/globex/workspaces/lab/"
    body = {
        "name": "probe",
        "image": "rayproject/ray:2.60.0",
        "entrypoint": probe_entrypoint(
            API_PORT=api_port,
            WORK_DIR=ray_work_dir,
            OTHER_DIR=acme_dir,
            PROJECT=str(Path(__file__).resolve().parents[2]),
            MARK=mark,
        ),
        "head": {"cpu": 0, "memory_gb": 1},
        "worker_groups": [{"name": "w", "replicas": 1, "cpu": 1, "memory_gb": 1}],
        "max_runtime_seconds": 300,
    }
    response = globex.post(base + "templates/", body, format="json")
    assert response.status_code == 201, response.content
    response = globex.post(base + "jobs/", {"template": response.json()["id"]}, format="json")
    assert response.status_code == 201, response.content
    probe_job = response.json()["id"]

    probe = wait_for(probe_job, TERMINAL, timeout=300)
    attempt = JobAttempt.objects.get(job_id=probe_job)
    log = attempt.log_archive
    assert log, (probe.state, probe.failure_reason, probe.message)
    results = [line for line in log.splitlines() if line.startswith(("BLOCKED", "ESCAPED"))]
    assert not [line for line in results if line.startswith("ESCAPED")], log[-4000:]
    names = {line.split()[1].rstrip(":") for line in results}
    assert names >= {
        "service_environ",
        "foreign_processes",
        "connect_127.0.0.1_5432",
        "connect_127.0.0.1_6379",
        f"connect_127.0.0.1_{api_port}",
        "other_cluster_dir",
        "write_outside",
        "fork_cap",
    }, log[-4000:]
    assert "detached process left" in log
    # The memory it asked for ran out: the kernel killed it and the attempt says so.
    assert "allocated" in log
    assert (probe.state, probe.failure_reason) == ("failed", "oom_killed"), probe.message
    assert attempt.failure_reason == "oom_killed"
    assert attempt.isolation["mode"] == "sandbox"
    assert set(attempt.isolation["namespaces"]) >= {"pid", "mount", "ipc", "net"}
    uid = sandbox_uid(attempt)
    assert uid != os.getuid() and uid >= 1000

    # Its neighbour was not disturbed.
    acme = wait_for(acme_job, TERMINAL)
    assert acme.state == "succeeded", (acme.failure_reason, acme.message)
    acme_attempt.refresh_from_db()
    assert "acme sum 2470" in acme_attempt.log_archive
    assert sandbox_uid(acme_attempt) != uid

    # Nothing is left: no process of either cluster (the detached one included), no directory.
    assert not os.path.exists(f"/tmp/{mark}")
    api.close()
    deadline = time.monotonic() + 30
    for done in (attempt, acme_attempt):
        handle = secrets.decrypt_json(done.handle_encrypted)
        while time.monotonic() < deadline and (
            cluster_processes(handle["temp_dir"])
            or processes_of_uid(sandbox_uid(done))
            or os.path.exists(handle["temp_dir"])
        ):
            time.sleep(0.5)
        assert cluster_processes(handle["temp_dir"]) == []
        assert processes_of_uid(sandbox_uid(done)) == []
        assert not os.path.exists(handle["temp_dir"])
    assert Job.objects.get(pk=acme_job).state == "succeeded"
    # and the job's detail shows what it was confined to
    detail = world.client("viewer").get(f"{WS}jobs/{acme_job}/").json()
    isolation = detail["attempts"][0]["isolation"]
    assert isolation["mode"] == "sandbox" and isolation["limits"]["memory_bytes"] > 0
    assert json.dumps(isolation)  # plain JSON
