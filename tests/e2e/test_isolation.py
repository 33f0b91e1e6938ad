"""A hostile tenant on the `local` target, end to end: real Celery worker, PostgreSQL, Redis and
sandboxed Ray clusters.

Organisation globex submits a job whose entrypoint tries every way out of its cluster that a
shared host offers; organisation acme's job runs beside it. Every attempt must fail, acme's job
must succeed, and after both nothing of either cluster may be left on the host.
"""

from __future__ import annotations

import base64
import contextlib
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
from jobs.launchers.local.leases import uids_holding_keys
from jobs.models import Job, JobAttempt
from tests.e2e.conftest import cluster_processes
from tests.e2e.servers import Api
from tests.e2e.test_launch import (
    TERMINAL,
    WS,
    make_template,
    py,
    submit,
    wait_for,
    world,  # noqa: F401  (fixture)
)
from tests.netns import private_host
from workspaces import services as ws_services

# The host's disk is measured before and after: no other test may write to it meanwhile.
pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.whole_host]

# Runs in globex's cluster. Each probe prints "BLOCKED <name>" or "ESCAPED <name>: <what>".
PROBE = r"""
import glob, json, os, signal, socket, sys, time

reports = []

def report(name, escaped, detail=""):
    verdict = "ESCAPED " if escaped else "BLOCKED "
    reports.append(verdict + name + (": " + detail if detail else ""))
    print(reports[-1], flush=True)

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

# The kernel's surface: nested user namespaces, keyrings, bpf, perf, userfaultfd, AIO, io_uring,
# mounts, the clocks. Each must fail with EPERM (or ENOSYS), not merely with bad arguments.
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
for call, number, args in [
    ("unshare_userns", 272, (0x10000000,)),
    ("add_key", 248, (b"user", b"manta", b"stolen", 6, -4)),
    ("keyctl", 250, (0, -4, 0)),
    ("bpf", 321, (0, 0, 0)),
    ("perf_event_open", 298, (0, 0, -1, -1, 0)),
    ("userfaultfd", 323, (0,)),
    ("io_setup", 206, (1, 0)),
    ("io_uring_setup", 425, (1, 0)),
    ("mount", 165, (b"none", b"/tmp", b"tmpfs", 0, 0)),
    ("clock_settime", 227, (0, 0)),
    ("ptrace_traceme", 101, (0, 0, 0, 0)),  # allowed unfiltered: only the filter refuses it
    ("pidfd_getfd", 438, (0, 1, 0)),
]:
    result = libc.syscall(number, *args)
    code = ctypes.get_errno()
    report("syscall_" + call, result != -1 or code not in (errno.EPERM, errno.ENOSYS),
           errno.errorcode.get(code, str(code)))

ptys = os.listdir("/dev/pts")
report("host_ptys", any(name.isdigit() for name in ptys), ", ".join(ptys[:8]))
held = []
try:
    for _ in range(400):
        held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    report("pty_cap", True, str(len(held)) + " ptys")
except OSError as exc:
    report("pty_cap", False, str(len(held)) + " ptys, then " + exc.strerror)
for fd in held:
    os.close(fd)

groups = os.listdir("/sys/fs/cgroup") if os.path.isdir("/sys/fs/cgroup") else []
own = open("/proc/self/cgroup").read()
report("cgroups_visible", bool(groups) or "manta" in own, " ".join(groups[:5]) + own[:200])

# Private, link-local and metadata addresses through the NAT: the egress policy refuses them.
for host, port in [(TEST_HOST, 8080), ("169.254.169.254", 80)]:
    try:
        with socket.create_connection((host, port), timeout=3):
            report(f"egress_{host}", True)
    except OSError as exc:
        report(f"egress_{host}", False, type(exc).__name__)

# The host's disk: the cluster writes to its own, and fills only that.
home = os.environ["HOME"]
disk = os.statvfs(home)
written = 0
try:
    with open(os.path.join(home, "fill"), "wb") as f:
        while written < 4 * 1024**3:
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1 << 20
    report("disk_unbounded", True, f"wrote {written >> 20} MiB")
except OSError as exc:
    report("disk_unbounded", False, f"{exc.strerror} after {written >> 20} MiB of a "
           f"{disk.f_blocks * disk.f_frsize >> 20} MiB disk")
os.unlink(os.path.join(home, "fill"))

# What the control plane reads back: a log file made 768 MiB long without using the disk
# (sparse), then a NUL and invalid UTF-8.
driver_log = os.readlink("/proc/self/fd/1")
if driver_log.startswith("/"):
    os.truncate(driver_log, 768 * 1024**2)
    print("sparse log of", os.stat(driver_log).st_size, "bytes", flush=True)
    # The archive keeps the log's end, which is now mostly the hole: say it all again.
    print("\n".join(reports), flush=True)
print("a NUL \x00 and invalid UTF-8 follow", flush=True)
sys.stdout.buffer.write(b"\xff\xfe\xc0 end\n")
sys.stdout.flush()
time.sleep(4)  # a log save and a logs/ read happen meanwhile

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


def benign(url: str) -> str:
    """acme's job: some Ray work, and a fetch from the private host its admin allow-listed."""
    return py(
        "import ray, time, urllib.request; ray.init(); "
        "square = ray.remote(lambda i: i * i); "
        "print('acme sum', sum(ray.get([square.remote(i) for i in range(20)]))); "
        f"print('acme fetched', urllib.request.urlopen('{url}', timeout=10).read().decode()); "
        "time.sleep(12); print('acme done')"
    )


def peak_rss_mib(root: int) -> float:
    """The largest peak resident size (VmHWM) among ``root`` and its descendants, in MiB."""
    peak = 0.0
    for pid in [root, *descendants(root)]:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) / 1024)
        except OSError:
            continue
    return peak


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def assert_gone(attempt: JobAttempt, within: float = 30) -> None:
    """Within ``within`` seconds, no process of the attempt's cluster or of its uid, and no
    cluster directory, is left."""
    handle = secrets.decrypt_json(attempt.handle_encrypted)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and (
        cluster_processes(handle["temp_dir"])
        or processes_of_uid(sandbox_uid(attempt))
        or os.path.exists(handle["temp_dir"])
    ):
        time.sleep(0.5)
    assert cluster_processes(handle["temp_dir"]) == []
    assert processes_of_uid(sandbox_uid(attempt)) == []
    assert not os.path.exists(handle["temp_dir"])


def loop_mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path)]


def files_of_uid(path: str, uid: int) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                if os.lstat(full).st_uid == uid:
                    found.append(full)
    return found


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


def test_a_hostile_job_reaches_nothing_while_its_neighbour_runs(
    world,  # noqa: F811
    worker,
    ray_work_dir,
    tmp_path,
):
    with contextlib.ExitStack() as stack:
        host = stack.enter_context(private_host())
        api = Api(worker.env, tmp_path / "api.log")
        api.start()
        stack.callback(api.stop)
        hostile_job_beside_a_neighbour(world, worker, ray_work_dir, host, api)


def hostile_job_beside_a_neighbour(world, worker, ray_work_dir, host, api):  # noqa: F811
    loopback = socket.socket()  # stands for a service on the host's loopback
    loopback.bind(("127.0.0.1", 0))
    loopback.listen()
    api_port = loopback.getsockname()[1]
    mark = f"manta-escape-{uuid.uuid4().hex}"
    disk_before = os.statvfs(ray_work_dir)
    worker_peak_before = peak_rss_mib(worker.proc.pid)

    # acme's admin opens the private test host to acme's jobs, and to no one else's.
    response = world.client("org_admin").post(
        "/api/v1/orgs/acme/compute-targets/",
        {"name": "local", "kind": "local", "config": {"egress_allow": [f"{host.address}/32"]}},
        format="json",
    )
    assert response.status_code == 201, response.content
    acme_template = make_template(world, entrypoint=benign(host.url))
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
            TEST_HOST=host.address,
        ),
        "head": {"cpu": 0, "memory_gb": 1, "disk_gb": 1},
        "worker_groups": [{"name": "w", "replicas": 1, "cpu": 1, "memory_gb": 1, "disk_gb": 1}],
        "max_runtime_seconds": 300,
    }
    response = globex.post(base + "templates/", body, format="json")
    assert response.status_code == 201, response.content
    response = globex.post(base + "jobs/", {"template": response.json()["id"]}, format="json")
    assert response.status_code == 201, response.content
    probe_job = response.json()["id"]

    # While it runs, the tenant's own logs/ through the API: read in bounded chunks, whatever
    # the log file claims to hold.
    api_answers = []
    deadline = time.monotonic() + 300
    while Job.objects.get(pk=probe_job).state not in TERMINAL and time.monotonic() < deadline:
        answer = api.call(world.tokens["foreign"], "GET", f"{base}jobs/{probe_job}/logs/?tail=20")
        api_answers.append(answer.status_code)
        time.sleep(1)
    assert set(api_answers) <= {200}, api_answers
    probe = wait_for(probe_job, TERMINAL, timeout=30)
    attempt = JobAttempt.objects.get(job_id=probe_job)
    log = attempt.log_archive
    assert log, (probe.state, probe.failure_reason, probe.message)
    results = [line for line in log.splitlines() if line.startswith(("BLOCKED", "ESCAPED"))]
    print("\n".join(dict.fromkeys(results)))
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
        "syscall_unshare_userns",
        "syscall_add_key",
        "syscall_keyctl",
        "syscall_bpf",
        "syscall_perf_event_open",
        "syscall_userfaultfd",
        "syscall_io_setup",
        "syscall_io_uring_setup",
        "syscall_mount",
        "syscall_clock_settime",
        "syscall_ptrace_traceme",
        "syscall_pidfd_getfd",
        "host_ptys",
        "pty_cap",
        "cgroups_visible",
        f"egress_{host.address}",
        "egress_169.254.169.254",
        "disk_unbounded",
        "fork_cap",
    }, log[-4000:]
    assert "No space left on device" in log
    # The hole is in the archive as U+FFFD, cut to its last MANTA_LOG_ARCHIVE_BYTES and marked.
    assert log.startswith("[manta: the first ") and "sparse log of 805306368 bytes" in log
    assert "\x00" not in log and "a NUL \ufffd and invalid UTF-8 follow" in log
    assert "detached process left" in log
    # The memory it asked for ran out: the kernel killed it and the attempt says so.
    assert "allocated" in log
    assert (probe.state, probe.failure_reason) == ("failed", "oom_killed"), probe.message
    assert attempt.failure_reason == "oom_killed"
    assert attempt.isolation["mode"] == "sandbox"
    assert set(attempt.isolation["namespaces"]) >= {"pid", "mount", "ipc", "net", "cgroup"}
    uid = sandbox_uid(attempt)
    assert uid != os.getuid() and uid >= 1000

    # Its neighbour was not disturbed, and reached what its admin allow-listed.
    acme = wait_for(acme_job, TERMINAL)
    assert acme.state == "succeeded", (acme.failure_reason, acme.message)
    acme_attempt.refresh_from_db()
    assert "acme sum 2470" in acme_attempt.log_archive
    assert f"acme fetched {host.answer}" in acme_attempt.log_archive
    assert sandbox_uid(acme_attempt) != uid

    # Nothing is left: no process of either cluster (the detached one included), no directory,
    # no disk, nothing the uid owns or holds in the kernel; the host's disk is as it was.
    assert not os.path.exists(f"/tmp/{mark}")
    loopback.close()
    for done in (attempt, acme_attempt):
        assert_gone(done)
    assert loop_mounts_under(ray_work_dir) == []
    assert files_of_uid(ray_work_dir, uid) == []
    assert uid not in uids_holding_keys()
    # The image file's blocks come back once the kernel lets go of the loop device it backed,
    # which it does after the unmount, in its own time (measured right away, 0.5 to 1.1 GiB of
    # the hostile job's full 2 GiB disk could still be held): what stays lost is what counts.
    deadline = time.monotonic() + 60
    while True:
        disk_after = os.statvfs(ray_work_dir)
        grown = (disk_before.f_bavail - disk_after.f_bavail) * disk_after.f_frsize
        if grown < 512 * 1024**2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert grown < 512 * 1024**2, f"the host's disk lost {grown >> 20} MiB"
    inodes = disk_before.f_favail - disk_after.f_favail
    assert inodes < 10_000, f"the host's filesystem lost {inodes} inodes"
    print(f"the host's disk: {grown >> 20} MiB and {inodes} inodes fewer free after both jobs")
    # The control plane read the 768 MiB log in bounded pieces: neither the worker nor the
    # API grew by anything like it.
    worker_growth = peak_rss_mib(worker.proc.pid) - worker_peak_before
    api_peak = peak_rss_mib(api.proc.pid)
    print(f"worker peak grew {worker_growth:.0f} MiB; API peak {api_peak:.0f} MiB")
    assert worker_growth < 400, worker_growth
    assert api_peak < 600, api_peak
    assert Job.objects.get(pk=acme_job).state == "succeeded"
    # and the job's detail shows what it was confined to
    detail = world.client("viewer").get(f"{WS}jobs/{acme_job}/").json()
    isolation = detail["attempts"][0]["isolation"]
    assert isolation["mode"] == "sandbox" and isolation["limits"]["memory_bytes"] > 0
    assert isolation["egress"].startswith("public internet only")
    assert json.dumps(isolation)  # plain JSON


# Runs in globex's cluster: it stops `ray start` (so nothing restarts or reacts), kills its own
# dashboard, listens on its port and answers Manta in turn with a redirect to a service on the
# host's loopback, a drip of one byte every half second, and 100 MiB.
IMPOSTOR = r"""
import os, signal, socket, threading, time
def ours(word):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if word in open(f"/proc/{pid}/cmdline", "rb").read():
                    found.append(int(pid))
            except OSError:
                pass
    return found
for pid in ours(b"\x00start\x00--block"):  # `ray start --block`, this sandbox's own
    os.kill(pid, signal.SIGSTOP)
for pid in ours(b"dashboard/dashboard.py"):
    os.kill(pid, signal.SIGKILL)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for _ in range(100):
    try:
        server.bind(("127.0.0.1", 8265))
        break
    except OSError:
        time.sleep(0.1)
server.listen(16)
print("impostor listening", flush=True)
turns = iter(range(1 << 30))
turns_lock = threading.Lock()
say_lock = threading.Lock()
def say(*words):  # print writes each word on its own: threads' lines would interleave
    with say_lock:
        print(*words, flush=True)
def answer(conn):
    try:
        request = conn.recv(65536).split(b"\r\n", 1)[0].decode(errors="replace")
        if not request.startswith("GET /api/"):
            # Ray's own processes report here too (POST /report_events): they take no turn,
            # so that Manta's first requests meet the redirect and the drip whatever they race.
            say("impostor ignores", request)
            return
        with turns_lock:
            turn = next(turns)
        say("impostor turn", turn, request)
        if turn % 3 == 0:
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:RECORDER/steal\r\n"
                         b"Content-Length: 0\r\n\r\n")
        elif turn % 3 == 1:
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100:
                conn.sendall(bytes([byte]))
                time.sleep(0.5)
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
            for _ in range(100):
                conn.sendall(b"x" * (1 << 20))
    except OSError:
        pass
    finally:
        conn.close()
while True:
    conn, _ = server.accept()
    threading.Thread(target=answer, args=(conn,), daemon=True).start()
"""


def test_a_job_that_replaces_its_dashboard_gets_nothing_from_manta(
    world,  # noqa: F811
    worker,
    ray_work_dir,
):
    recorder = socket.socket()  # a service on the host's loopback the impostor points Manta at
    recorder.bind(("127.0.0.1", 0))
    recorder.listen()
    recorder.setblocking(False)
    code = IMPOSTOR.replace("RECORDER", str(recorder.getsockname()[1]))
    encoded = base64.b64encode(zlib.compress(code.encode(), 9)).decode()
    template = make_template(
        world,
        entrypoint=py(f"import base64, zlib; exec(zlib.decompress(base64.b64decode('{encoded}')))"),
        head={"cpu": 1, "memory_gb": 1, "disk_gb": 1},
        worker_groups=[],
        max_runtime_seconds=600,
    )
    job_id = submit(world, template)
    # The impostor may take the port before Manta ever hears RUNNING: either way it is lost.
    wait_for(job_id, {"running", *TERMINAL})
    deadline = time.monotonic() + 60
    while "impostor listening" not in world.client("developer").get(
        f"{WS}jobs/{job_id}/logs/"
    ).json().get("logs", ""):
        assert time.monotonic() < deadline, "the impostor never started"
        time.sleep(1)

    # logs/ reads the head's log file, not the impostor: it answers at once.
    started = time.monotonic()
    answer = world.client("developer").get(f"{WS}jobs/{job_id}/logs/?tail=5")
    assert answer.status_code == 200 and time.monotonic() - started < 3
    worker_before = peak_rss_mib(worker.proc.pid)

    # Manta cannot tell what its cluster does any more: it loses it, within the bound each
    # status read has (30 s), and tears it down.
    job = wait_for(job_id, TERMINAL, timeout=240)
    assert (job.state, job.failure_reason) == ("failed", "cluster_lost"), job.message
    with pytest.raises(BlockingIOError):
        recorder.accept()  # the redirect was never followed
    recorder.close()
    attempt = JobAttempt.objects.get(job_id=job_id)
    # Manta did ask the impostor, and got the redirect and the drip (at least) for an answer.
    assert "impostor turn 0 GET /api/" in attempt.log_archive, attempt.log_archive[-2000:]
    assert "impostor turn 1 " in attempt.log_archive, attempt.log_archive[-2000:]
    assert peak_rss_mib(worker.proc.pid) - worker_before < 200  # the 100 MiB were not read
    assert_gone(attempt)
    assert loop_mounts_under(ray_work_dir) == []
