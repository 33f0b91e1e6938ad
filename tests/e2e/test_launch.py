"""The whole governed flow with a real Celery worker (Redis broker, PostgreSQL) launching real
local Ray clusters: success with logs, failure with Ray's message and a retry on a fresh
cluster, deadline, cancel beside a neighbour that goes on, and a worker killed mid-job. Jobs
that need no worker node run on a head alone (fewer processes on a 2-core machine)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import time
import uuid
import zipfile

import pytest

from config import secrets
from jobs.models import Job, JobAttempt, JobEvent
from outbox.models import DomainEvent
from quotas.models import Reservation
from tests.conftest import build_world
from tests.e2e.conftest import cluster_processes

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WS = "/api/v1/orgs/acme/workspaces/ml/"
TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}


def py(code: str) -> str:
    """A one-line entrypoint running ``code`` (statements separated by ';')."""
    return 'python -c "' + code.replace('"', '\\"') + '"'


COUNTER = py(
    "import json, os, ray; ray.init(); "
    "print('resources', json.dumps(ray.cluster_resources(), sort_keys=True)); "
    "C = ray.remote(type('C', (), {'__init__': lambda s: setattr(s, 'n', 0), "
    "'inc': lambda s: setattr(s, 'n', s.n + 1) or s.n})); c = C.remote(); "
    "print('counter reached', [ray.get(c.inc.remote()) for _ in range(10)][-1])"
)


def marker_entrypoint(*, sleep: float = 0, fail_first: bool = False) -> str:
    """Prints a start line each time it starts (so a test can count real runs from the logs,
    the only thing a sandboxed job leaves behind); with ``fail_first`` the first attempt fails."""
    code = (
        "import os, sys, time; first = os.environ['MANTA_ATTEMPT'] == '1'; "
        "print('run started', flush=True); "
        f"time.sleep({sleep}); "
    )
    code += "sys.exit(7 if first else 0)" if fail_first else "print('done')"
    return py(code)


def runs(job_id: int) -> int:
    """How many times the job's entrypoint started, over all its attempts' archived logs."""
    logs = JobAttempt.objects.filter(job_id=job_id).values_list("log_archive", flat=True)
    return sum(line == "run started" for log in logs for line in log.splitlines())


@pytest.fixture
def world(e2e):
    return build_world()


def make_template(world, **spec):
    body = {
        "name": f"t-{uuid.uuid4().hex[:8]}",
        "image": "rayproject/ray:2.60.0",
        "entrypoint": COUNTER,
        "head": {"cpu": 0, "memory_gb": 1},
        "worker_groups": [{"name": "workers", "replicas": 1, "cpu": 1, "memory_gb": 1}],
        "max_runtime_seconds": 120,
        **spec,
    }
    response = world.client("ws_admin").post(WS + "templates/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def submit(world, template_id, who="developer"):
    response = world.client(who).post(WS + "jobs/", {"template": template_id}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def wait_cancelled_and_gone(job_id: int, work_dir: str, timeout: float) -> JobAttempt:
    """The job's attempt once it is cancelled and no process of any cluster is left."""
    attempt = JobAttempt.objects.get(job_id=job_id)
    deadline = time.monotonic() + timeout
    while (attempt.state != "cancelled" or cluster_processes(work_dir)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.3)
        attempt.refresh_from_db()
    assert attempt.state == "cancelled"
    return attempt


def logs_of(world, job_id: int) -> str:
    return world.client("developer").get(f"{WS}jobs/{job_id}/logs/").json()["logs"]


def wait_for(job_id, states, timeout=180):
    """Poll until the job is in one of ``states`` (a liveness bound, not a speed check)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job_id)
        if job.state in states:
            return job
        time.sleep(0.25)
    events = list(JobEvent.objects.filter(job_id=job_id).values_list("kind", "reason"))
    raise AssertionError(f"job {job_id} is {job.state}, never reached {states}: {events}")


def assert_cluster_gone(attempt: JobAttempt, work_dir: str, timeout: float = 30):
    handle = secrets.decrypt_json(attempt.handle_encrypted)
    assert handle, "the attempt never stored a cluster handle"
    deadline = time.monotonic() + timeout
    alive = None
    while time.monotonic() < deadline:
        alive = [p for p in cluster_processes(handle["temp_dir"])]
        if not alive and not os.path.exists(handle["temp_dir"]):
            return
        time.sleep(0.5)
    raise AssertionError(f"cluster {attempt.cluster_name} still has processes {alive}")


def test_job_succeeds_with_logs_and_advertised_resources(world, ray_work_dir):
    template = make_template(
        world,
        worker_groups=[{"name": "gpus", "replicas": 1, "cpu": 1, "memory_gb": 1, "gpu": 2,
                        "resources": {"accel": 1}}],
    )  # fmt: skip
    job_id = submit(world, template)
    job = wait_for(job_id, TERMINAL)
    assert job.state == "succeeded", (job.failure_reason, job.message)
    client = world.client("viewer")
    detail = client.get(f"{WS}jobs/{job_id}/").json()
    [attempt] = detail["attempts"]
    assert attempt["state"] == "succeeded" and attempt["submission_id"]
    assert attempt["cluster_name"].startswith("manta-acme-ml-")
    assert attempt["dashboard_url"] == ""  # its cluster is gone, and its dashboard with it
    assert all(v is not None and v >= 0 for v in attempt["phases"].values()), attempt["phases"]
    logs = client.get(f"{WS}jobs/{job_id}/logs/").json()
    assert logs["source"] == "archive"
    assert "counter reached 10" in logs["logs"]
    # the worker node advertised exactly its spec, 2 GPUs on a machine without any
    assert '"GPU": 2.0' in logs["logs"] and '"accel": 1.0' in logs["logs"]
    assert '"CPU": 1.0' in logs["logs"]  # the head advertises none
    tail = client.get(f"{WS}jobs/{job_id}/logs/", {"tail": 1}).json()["logs"]
    assert tail.strip().splitlines() == ["counter reached 10"]
    kinds = list(JobEvent.objects.filter(job_id=job_id).values_list("to_state", flat=True))
    assert kinds == ["queued", "launching", "running", "succeeded"]
    assert_cluster_gone(JobAttempt.objects.get(job_id=job_id), ray_work_dir)


def test_a_package_of_the_developers_code_runs_on_its_cluster(world, ray_work_dir):
    """The code travels as Ray ships a local directory: into the cluster's GCS through the
    dashboard; the sandboxed cluster reads nothing of this host."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.py", "import helper, ray\nray.init()\nprint(helper.greet())\n")
        archive.writestr("helper.py", "def greet():\n    return 'hello from a package'\n")
    uploaded = world.client("developer").post(
        WS + "packages/", data=buffer.getvalue(), content_type="application/zip"
    )
    assert uploaded.status_code == 201, uploaded.content
    template = make_template(
        world,
        entrypoint="python train.py",
        runtime_env={"working_dir": uploaded.json()["uri"]},
        worker_groups=[],
    )
    job = wait_for(submit(world, template), TERMINAL)
    attempt = JobAttempt.objects.get(job=job)
    assert job.state == "succeeded", (job.failure_reason, job.message, attempt.log_archive)
    assert "hello from a package" in attempt.log_archive
    assert_cluster_gone(attempt, ray_work_dir)


@pytest.fixture
def git_repo(tmp_path):
    from tests.gitserver import Repository

    repository = Repository(tmp_path)
    yield repository
    repository.stop()


def test_a_job_from_a_git_code_source_runs_the_commit_it_records(world, ray_work_dir, git_repo):
    """The worker fetches the ref from a git daemon on 127.0.0.1, packages that commit and
    ships it like an upload; the attempt names the commit."""
    head = git_repo.push()
    created = world.client("ws_admin").post(
        WS + "code-sources/", {"name": "trainer", "url": git_repo.url}, format="json"
    )
    assert created.status_code == 201, created.content
    template = make_template(
        world, entrypoint="python train.py", code={"source": "trainer"}, worker_groups=[]
    )
    job = wait_for(submit(world, template), TERMINAL)
    attempt = JobAttempt.objects.get(job=job)
    assert job.state == "succeeded", (job.failure_reason, job.message, attempt.log_archive)
    assert "hello from git" in attempt.log_archive
    detail = world.client("developer").get(f"{WS}jobs/{job.pk}/").json()
    assert detail["attempts"][0]["code_commit"] == head
    assert_cluster_gone(attempt, ray_work_dir)


def test_follow_streams_the_log_while_the_job_runs_and_ends_with_it(world, ray_work_dir):
    code = (
        "import time; [print('line', n, flush=True) or time.sleep(0.4) for n in range(15)]; "
        "print('the end')"
    )
    template = make_template(world, entrypoint=py(code), worker_groups=[])
    job_id = submit(world, template)
    response = world.client("developer").get(f"{WS}jobs/{job_id}/logs/", {"follow": "true"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    chunks, states = [], []
    for chunk in response.streaming_content:
        chunks.append(chunk.decode())
        states.append(Job.objects.get(pk=job_id).state)
    text = "".join(chunks)
    lines = [line for line in text.splitlines() if line.startswith("line ")]
    assert lines == [f"line {n}" for n in range(15)] and text.rstrip().endswith("the end")
    assert "running" in states  # lines came while it ran, not at the end
    job = wait_for(job_id, TERMINAL)
    assert job.state == "succeeded"
    # From an offset: only what came after it, whether followed or read at once.
    offset = text.index("line 10")
    again = world.client("developer").get(
        f"{WS}jobs/{job_id}/logs/", {"follow": "true", "since": offset}
    )
    rest = b"".join(again.streaming_content).decode()
    assert rest == text[offset:] and rest.startswith("line 10")
    assert logs_of_since(world, job_id, offset) == rest


def logs_of_since(world, job_id: int, since: int) -> str:
    answer = world.client("developer").get(f"{WS}jobs/{job_id}/logs/", {"since": since})
    return answer.json()["logs"]


def test_deadline_stops_the_job(world, ray_work_dir):
    template = make_template(world, entrypoint=py("import time; time.sleep(300)"),
                             max_runtime_seconds=4, worker_groups=[])  # fmt: skip
    job = wait_for(submit(world, template), TERMINAL)
    assert job.state == "failed" and job.failure_reason == "deadline_exceeded"
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.running_at and attempt.finished_at
    assert_cluster_gone(attempt, ray_work_dir)


def test_a_failed_entrypoint_retries_on_a_fresh_cluster(world, ray_work_dir):
    """The first run exits 7: its attempt fails with Ray's message and its log; the retry runs
    on a cluster of its own and succeeds."""
    template = make_template(world, entrypoint=marker_entrypoint(fail_first=True),
                             max_retries=1, worker_groups=[])  # fmt: skip
    job = wait_for(submit(world, template), TERMINAL)
    assert job.state == "succeeded", (job.failure_reason, job.message)
    first, second = JobAttempt.objects.filter(job=job).order_by("number")
    assert (first.state, second.state) == ("failed", "succeeded")
    assert first.failure_reason == "entrypoint_failed" and first.ray_status == "FAILED"
    assert first.exit_code == 7 or "exit code 7" in first.ray_message, first.ray_message
    assert "run started" in first.log_archive
    assert first.cluster_name != second.cluster_name
    assert first.submission_id != second.submission_id
    assert (
        secrets.decrypt_json(first.handle_encrypted)["dashboard_url"]
        != secrets.decrypt_json(second.handle_encrypted)["dashboard_url"]
    )
    assert runs(job.pk) == 2
    kinds = list(JobEvent.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds.count("retry") == 1
    for attempt in (first, second):
        assert_cluster_gone(attempt, ray_work_dir)


def test_head_killed_mid_job_ends_the_attempt_cluster_lost_and_retries(world, ray_work_dir):
    code = (
        "import os, time; print('run started', flush=True); "
        "time.sleep(300 if os.environ['MANTA_ATTEMPT'] == '1' else 0); print('done')"
    )
    template = make_template(world, entrypoint=py(code), max_retries=1, worker_groups=[])
    job_id = submit(world, template)
    wait_for(job_id, {"running"})
    first = JobAttempt.objects.get(job_id=job_id, number=1)
    deadline = time.monotonic() + 60
    while "run started" not in logs_of(world, job_id) or not first.log_archive:
        assert time.monotonic() < deadline, "the log was never saved"
        time.sleep(0.3)
        first.refresh_from_db()
    head_dir = secrets.decrypt_json(first.handle_encrypted)["nodes"][0]["temp_dir"]
    killed = []
    for pid in cluster_processes(head_dir):  # every process of the head node, and only those
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    assert killed
    # A follower of the first attempt's log never sees its lines disappear, live or archived.
    client, seen = world.client("developer"), []
    while Job.objects.get(pk=job_id).state not in TERMINAL:
        answer = client.get(f"{WS}jobs/{job_id}/logs/", {"attempt": 1}).json()
        seen.append(answer["source"])
        assert "run started" in answer["logs"], answer
        time.sleep(0.2)
    assert seen and seen[-1] == "archive"
    job = wait_for(job_id, TERMINAL, timeout=240)
    assert job.state == "succeeded", (job.failure_reason, job.message)
    first.refresh_from_db()
    assert (first.state, first.failure_reason) == ("failed", "cluster_lost")
    second = JobAttempt.objects.get(job_id=job_id, number=2)
    assert second.state == "succeeded" and "done" in second.log_archive
    for attempt in (first, second):
        assert_cluster_gone(attempt, ray_work_dir)
    assert not Reservation.objects.filter(job_id=job_id, released_at__isnull=True).exists()


def test_worker_node_killed_mid_job_comes_back_and_the_job_succeeds(world, ray_work_dir):
    """Tasks need the worker node's CPU (the head has none): SIGKILL that node's Ray processes
    mid-run, and it is started again, Ray retries the lost task there, and the one run ends."""
    code = (
        "import ray, time; ray.init(); print('run started', flush=True); "
        "f = ray.remote(num_cpus=1)(lambda i: (time.sleep(1), i)[1]); "
        "refs = [f.remote(i) for i in range(12)]; "
        "[print('task', ray.get(r), flush=True) for r in refs]; print('sum', sum(ray.get(refs)))"
    )
    template = make_template(world, entrypoint=py(code))
    job_id = submit(world, template)
    wait_for(job_id, {"running"})
    attempt = JobAttempt.objects.get(job_id=job_id)
    deadline = time.monotonic() + 60
    while "task 2" not in logs_of(world, job_id):
        assert time.monotonic() < deadline, logs_of(world, job_id)
        time.sleep(0.3)
    node = secrets.decrypt_json(attempt.handle_encrypted)["nodes"][1]
    # Every Ray process of the worker node; the launcher's wrapper outside the sandbox exits
    # by itself once its child is gone.
    pids = [pid for pid in cluster_processes(node["temp_dir"]) if pid != node["pid"]]
    assert pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job = wait_for(job_id, TERMINAL, timeout=180)
    attempt.refresh_from_db()
    assert job.state == "succeeded", (job.failure_reason, job.message)
    assert "sum 66" in attempt.log_archive and runs(job_id) == 1
    restarted = JobEvent.objects.get(job_id=job_id, kind="node_restarted")
    assert restarted.data == {"attempt": 1, "node": "w0", "group": "workers", "restarts": 1}
    assert (restarted.from_state, restarted.to_state) == ("running", "running")
    assert DomainEvent.objects.filter(type="job.node_restarted", payload__job__id=job_id).exists()
    timeline = world.client("developer").get(f"{WS}jobs/{job_id}/events/").json()
    assert "node_restarted" in [entry["kind"] for entry in timeline["results"]]
    assert JobAttempt.objects.filter(job_id=job_id).count() == 1
    assert_cluster_gone(attempt, ray_work_dir)


def check_dashboard_through_manta(world, job_id: int) -> None:
    """The running job's real Ray Dashboard, read through Manta: its page and its job list; a
    second job posted to it is refused, and Ray still holds one job."""
    attempt = JobAttempt.objects.get(job_id=job_id)
    dashboard = f"{WS}jobs/{job_id}/dashboard/"
    client = world.client("viewer")
    assert client.get(f"{WS}jobs/{job_id}/").json()["attempts"][0]["dashboard_url"] == dashboard
    page = client.get(dashboard)
    assert page.status_code == 200, page.content
    assert b"<title>Ray Dashboard</title>" in page.content
    assert b'src="./static/js/main.' in page.content  # relative: it stays under the proxy
    script = re.search(rb'src="\./(static/js/main\.[0-9a-f]+\.js)"', page.content).group(1)
    asset = client.get(dashboard + script.decode())
    assert asset.status_code == 200 and b"react" in asset.content.lower()
    listed = client.get(dashboard + "api/jobs/")
    assert listed.status_code == 200, listed.content
    assert [job["submission_id"] for job in listed.json()] == [attempt.submission_id]
    second = {"entrypoint": "echo second", "submission_id": "second"}
    refused = world.client("developer").post(dashboard + "api/jobs/", second, format="json")
    assert refused.status_code == 403 and refused.json()["type"] == "dashboard_read_only"
    after = client.get(dashboard + "api/jobs/").json()
    assert [job["submission_id"] for job in after] == [attempt.submission_id]
    assert world.client("foreign").get(dashboard + "api/jobs/").status_code == 404


def test_cancel_while_running_tears_its_cluster_down_and_the_neighbour_goes_on(world, ray_work_dir):
    """Two clusters side by side; the cancelled one goes, the other runs to success."""
    slow = make_template(world, entrypoint=py("import time; time.sleep(300)"), worker_groups=[])
    ok = make_template(world, entrypoint=marker_entrypoint(sleep=12), worker_groups=[])
    doomed, survivor = submit(world, slow), submit(world, ok)
    wait_for(doomed, {"running"})
    wait_for(survivor, {"running"})
    check_dashboard_through_manta(world, doomed)
    response = world.client("developer").post(f"{WS}jobs/{doomed}/cancel/", {}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    attempt = JobAttempt.objects.get(job_id=doomed)
    deadline = time.monotonic() + 60
    while attempt.state != "cancelled" and time.monotonic() < deadline:
        time.sleep(0.3)
        attempt.refresh_from_db()
    assert attempt.state == "cancelled"
    assert_cluster_gone(attempt, ray_work_dir)
    assert Job.objects.get(pk=doomed).state == "cancelled"
    gone = world.client("viewer").get(f"{WS}jobs/{doomed}/dashboard/")
    assert gone.status_code == 409 and "gone" in gone.json()["detail"]
    finished = wait_for(survivor, TERMINAL)
    assert finished.state == "succeeded", (finished.failure_reason, finished.message)
    assert "done" in JobAttempt.objects.get(job_id=survivor).log_archive
    assert_cluster_gone(JobAttempt.objects.get(job_id=survivor), ray_work_dir)


def test_cancel_while_the_cluster_starts_stops_the_start(world, e2e, ray_work_dir):
    """A 15-node cluster takes far longer to start on this machine than the start loop takes
    to notice a cancel: the start stops, what had started is torn down, no handle is stored."""
    template = make_template(
        world,
        entrypoint=py("print('never')"),
        worker_groups=[{"name": "many", "replicas": 14, "cpu": 0, "memory_gb": 0.5}],
    )
    job_id = submit(world, template)
    wait_for(job_id, {"launching"})
    deadline = time.monotonic() + 60
    while not cluster_processes(ray_work_dir):  # the head is starting
        assert time.monotonic() < deadline, "no node ever started"
        time.sleep(0.1)
    response = world.client("developer").post(f"{WS}jobs/{job_id}/cancel/", {}, format="json")
    assert response.status_code == 200
    attempt = wait_cancelled_and_gone(job_id, ray_work_dir, timeout=60)
    assert cluster_processes(ray_work_dir) == []
    assert attempt.cluster_ready_at is None and not attempt.handle_encrypted
    log = e2e.log_path.read_text(errors="replace")
    assert "the cluster's start stopped: its attempt was cancelled or preempted" in log
    assert not [n for n in os.listdir(ray_work_dir) if n.startswith("mr-")]


def test_launch_killed_then_job_cancelled_leaves_no_orphan(world, e2e, ray_work_dir):
    """The worker dies while the cluster starts (no handle stored yet), the job is cancelled
    meanwhile: once a worker is back, the cluster the dead launch started is found and stopped."""
    template = make_template(world, entrypoint=py("print('never')"))
    job_id = submit(world, template)
    wait_for(job_id, {"launching"})
    deadline = time.monotonic() + 60
    # The head's GCS is up: a node's own daemons, in the cluster's session, not the wrapper
    # that the launch is still starting them from (which dies with the worker).
    while not cluster_processes(ray_work_dir, named=b"gcs_server"):
        assert time.monotonic() < deadline, "no node ever started"
        time.sleep(0.1)
    e2e.kill()
    assert cluster_processes(ray_work_dir)  # the nodes outlive the launch that started them
    response = world.client("developer").post(f"{WS}jobs/{job_id}/cancel/", {}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    e2e.start()
    attempt = wait_cancelled_and_gone(job_id, ray_work_dir, timeout=90)
    assert attempt.torn_down_at is not None
    assert cluster_processes(ray_work_dir) == []
    assert not [n for n in os.listdir(ray_work_dir) if n.startswith("mr-")]
    assert runs(job_id) == 0


@pytest.mark.parametrize("phase", ["launching", "running"])
def test_worker_killed_mid_job_is_replaced(world, e2e, ray_work_dir, phase):
    template = make_template(world, entrypoint=marker_entrypoint(sleep=8))
    job_id = submit(world, template)
    if phase == "launching":
        wait_for(job_id, {"launching"})
        time.sleep(1.0)  # the cluster is starting
    else:
        wait_for(job_id, {"running"})
    e2e.kill()
    e2e.start()
    job = wait_for(job_id, TERMINAL, timeout=240)
    assert job.state == "succeeded", (job.failure_reason, job.message)
    attempts = list(JobAttempt.objects.filter(job=job))
    assert len(attempts) == 1
    # exactly one run of the entrypoint: one Ray submission for the attempt
    assert runs(job.pk) == 1
    terminal = JobEvent.objects.filter(job=job, to_state__in=TERMINAL).count()
    assert terminal == 1
    assert_cluster_gone(attempts[0], ray_work_dir)
