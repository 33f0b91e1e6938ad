"""SIGKILL the API, the worker and its beat at once, with jobs in every state, then start them
again: each job ends in the state it should, every attempt ran its entrypoint once, no cluster
is left and the quota books balance. Real gunicorn, Celery, PostgreSQL, Redis and Ray."""

from __future__ import annotations

import os
import time

import pytest

from jobs.accounting import reconcile
from jobs.models import Job, JobAttempt
from quotas.models import Reservation
from tests.conftest import build_world
from tests.e2e.conftest import cluster_processes, start_launch_worker
from tests.e2e.servers import Api
from tests.e2e.test_launch import WS, marker_entrypoint, py, runs

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}
# Two clusters of a 1-CPU worker and a 0-CPU head at a time (each holds 2 CPUs: its sandboxes
# give the head 1): a third job waits in the queue for the host's capacity.
CAPACITY = "cpu=4,memory_gb=64,disk_gb=1000"


@pytest.fixture
def crash_worker(django_db_setup, django_db_blocker, ray_work_dir, tmp_path_factory):
    proc = start_launch_worker(tmp_path_factory, ray_work_dir, MANTA_LOCAL_CAPACITY=CAPACITY)
    yield proc
    proc.stop()


@pytest.fixture
def api(crash_worker, tmp_path):
    server = Api(crash_worker.env, tmp_path / "api.log")
    server.start()
    yield server
    server.stop()


def call(api: Api, token: str, method: str, path: str, body=None, expect=None):
    response = api.call(token, method, path, body)
    if expect is not None:
        assert response.status_code == expect, response.text
    return response.json()


def state_of(job_id: int) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def wait_state(job_id: int, states: set[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while state_of(job_id) not in states:
        assert time.monotonic() < deadline, f"job {job_id} still {state_of(job_id)}"
        time.sleep(0.3)


def test_everything_killed_at_once_recovers_every_job(
    transactional_db, crash_worker, api, ray_work_dir
):
    world = build_world()
    dev, admin = world.tokens["developer"], world.tokens["ws_admin"]
    # 1 GB nodes hold 4.6 GB of the sandbox's memory, the 3 GB worker's job 7.2: only it waits.
    policy = {"approval_policy": "threshold", "approval_thresholds": {"memory_gb": 6}}
    call(api, world.tokens["org_admin"], "PATCH", WS, policy, expect=200)  # the org's setting

    def template(entrypoint: str, memory_gb: float = 1) -> int:
        body = {
            "name": f"t{time.monotonic_ns()}",
            "image": "rayproject/ray:2.60.0",
            "entrypoint": entrypoint,
            "head": {"cpu": 0, "memory_gb": 1},
            "worker_groups": [{"name": "w", "replicas": 1, "cpu": 1, "memory_gb": memory_gb}],
            "max_runtime_seconds": 300,
        }
        return call(api, admin, "POST", WS + "templates/", body, expect=201)["id"]

    def submit(template_id: int) -> int:
        return call(api, dev, "POST", WS + "jobs/", {"template": template_id}, expect=201)["id"]

    quick, slow = template(marker_entrypoint()), template(marker_entrypoint(sleep=25))
    forever = template(py("import time; print('run started', flush=True); time.sleep(600)"))
    big = template(marker_entrypoint(), memory_gb=3)

    done = submit(quick)
    wait_state(done, {"succeeded"})
    running, cancelled = submit(slow), submit(forever)
    wait_state(running, {"running"})
    wait_state(cancelled, {"running"})
    pending = submit(big)
    launching, queued = submit(quick), submit(quick)
    assert {state_of(launching), state_of(queued)} == {"queued"}  # the host is full
    call(api, dev, "POST", f"{WS}jobs/{cancelled}/cancel/", {}, expect=200)
    wait_state(launching, {"launching"})
    deadline = time.monotonic() + 60
    while not JobAttempt.objects.filter(job_id=launching, launch_started_at__isnull=False):
        assert time.monotonic() < deadline, "the launch never started"
        time.sleep(0.1)
    time.sleep(2)  # its cluster is starting
    before = {job: state_of(job) for job in (done, running, cancelled, pending, launching, queued)}
    assert before == {
        done: "succeeded",
        running: "running",
        cancelled: "cancelled",
        pending: "pending_approval",
        launching: "launching",
        queued: "queued",
    }

    api.kill()  # the API, the worker and its beat at once
    crash_worker.kill()
    api.start()
    crash_worker.start()

    for job in (running, launching, queued):
        wait_state(job, TERMINAL, timeout=240)
    assert state_of(pending) == "pending_approval"
    reject = {"reason": "too big for now"}
    call(api, world.tokens["owner"], "POST", f"{WS}jobs/{pending}/reject/", reject, expect=200)
    after = {job: state_of(job) for job in before}
    assert after == {
        done: "succeeded",
        running: "succeeded",
        cancelled: "cancelled",
        pending: "rejected",
        launching: "succeeded",
        queued: "succeeded",
    }
    # One Ray submission per attempt: each entrypoint started exactly once.
    for job in (done, running, launching, queued):
        assert JobAttempt.objects.filter(job_id=job).count() == 1
        assert runs(job) == 1, job
    attempt = JobAttempt.objects.get(job_id=cancelled)
    assert attempt.state == "cancelled"
    # No cluster left, no reservation held, no drift in the quota books.
    deadline = time.monotonic() + 60
    while cluster_processes(ray_work_dir) or any(
        n.startswith("mr-") for n in os.listdir(ray_work_dir)
    ):
        assert time.monotonic() < deadline, cluster_processes(ray_work_dir)
        time.sleep(0.5)
    assert not Reservation.objects.filter(released_at__isnull=True).exists()
    assert sum(reconcile().values()) == 0
