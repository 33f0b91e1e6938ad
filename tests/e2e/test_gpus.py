"""Physical GPUs end to end: a worker whose host has an inventory of 4 GPUs (set, since the
machine has none), two concurrent 2-GPU jobs on disjoint devices, and a third that waits for
the host's GPUs and says so."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from jobs import local_host
from jobs.logs import job_logs
from jobs.models import Job
from tests.conftest import build_world
from tests.e2e.conftest import start_launch_worker
from tests.e2e.test_launch import TERMINAL, WS, make_template, py, submit, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

SHOW_DEVICES = py(
    "import os, ray, time; ray.init(); "
    "f = ray.remote(num_gpus=2, num_cpus=0)(lambda: os.environ.get('CUDA_VISIBLE_DEVICES')); "
    "print('devices', ray.get(f.remote()), flush=True); time.sleep(15)"
)


@pytest.fixture(scope="module")
def gpu_worker(django_db_setup, django_db_blocker, ray_work_dir, tmp_path_factory):
    proc = start_launch_worker(tmp_path_factory, ray_work_dir, MANTA_LOCAL_GPUS="4")
    yield proc
    proc.stop()


@pytest.fixture
def world(gpu_worker, transactional_db, settings):
    # this process explains and checks submissions too
    settings.MANTA_LOCAL_GPUS = ("0", "1", "2", "3")
    local_host.gpu_inventory.cache_clear()
    yield build_world()
    local_host.gpu_inventory.cache_clear()
    connection.close()


def devices(job_id: int) -> set[str] | None:
    for line in job_logs(Job.objects.get(pk=job_id))["logs"].splitlines():
        if line.startswith("devices "):
            return set(line.split()[1].split(","))
    return None


def test_concurrent_gpu_jobs_get_disjoint_devices_and_a_third_waits(world):
    template = make_template(
        world,
        entrypoint=SHOW_DEVICES,
        # no CPUs: the host's 2 CPUs must not be what the third job waits for
        worker_groups=[{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 1, "gpu": 2}],
    )
    first, second, third = (submit(world, template) for _ in range(3))
    wait_for(first, {"running"})
    wait_for(second, {"running"})
    deadline = time.monotonic() + 60
    while (devices(first) is None or devices(second) is None) and time.monotonic() < deadline:
        time.sleep(0.5)
    a, b = devices(first), devices(second)
    assert a and b and len(a) == len(b) == 2, (a, b)
    assert not a & b and a | b == {"0", "1", "2", "3"}

    waiting = world.client("developer").get(f"{WS}jobs/{third}/").json()
    assert waiting["state"] == "queued"
    assert "this host's gpu capacity 4" in waiting["queue"]["waiting_for"], waiting["queue"]

    for job_id in (first, second, third):
        job = wait_for(job_id, TERMINAL, timeout=240)
        assert job.state == "succeeded", (job.failure_reason, job.message)
    assert len(devices(third)) == 2
