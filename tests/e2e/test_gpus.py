"""Physical GPUs end to end: a worker whose host has a typed inventory of 4 GPUs (h100: 0, 1;
a100: 2, 3; set, since the machine has none), an h100 job and an a100 job running at once,
each seeing only the devices of its flavor, and a third (any flavor) that waits for the host's
GPUs and says so."""

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

# The GPU inventory's devices are leased host-wide: no other test may hold one meanwhile.
pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.whole_host]


def show_devices(then_sleep: int) -> str:
    """An entrypoint printing the devices its 2-GPU task sees and the cluster's accelerator
    types, then sleeping (so that it still runs while the test looks)."""
    return py(
        "import os, ray, time; ray.init(); "
        "f = ray.remote(num_gpus=2, num_cpus=0)(lambda: os.environ.get('CUDA_VISIBLE_DEVICES')); "
        "print('devices', ray.get(f.remote()), flush=True); "
        "print('accelerators', ','.join(sorted(k for k in ray.cluster_resources() "
        f"if k.startswith('accelerator_type:'))) or '-', flush=True); time.sleep({then_sleep})"
    )


@pytest.fixture(scope="module")
def gpu_worker(django_db_setup, django_db_blocker, ray_work_dir, tmp_path_factory):
    proc = start_launch_worker(tmp_path_factory, ray_work_dir, MANTA_LOCAL_GPUS="h100:0,1;a100:2,3")
    yield proc
    proc.stop()


@pytest.fixture
def world(gpu_worker, transactional_db, settings):
    # this process explains and checks submissions too
    settings.MANTA_LOCAL_GPUS = ("0", "1", "2", "3")
    settings.MANTA_LOCAL_GPU_FLAVORS = {"0": "h100", "1": "h100", "2": "a100", "3": "a100"}
    local_host.gpu_inventory.cache_clear()
    yield build_world()
    local_host.gpu_inventory.cache_clear()
    connection.close()


def printed(job_id: int, what: str) -> set[str] | None:
    for line in job_logs(Job.objects.get(pk=job_id))["logs"].splitlines():
        if line.startswith(f"{what} "):
            return set(line.split()[1].split(","))
    return None


def devices(job_id: int) -> set[str] | None:
    return printed(job_id, "devices")


def test_each_flavor_gets_only_its_devices_and_a_third_job_waits(world):
    # no CPUs: the host's 2 CPUs must not be what the third job waits for
    groups = [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 1, "gpu": 2}]
    # The first two run on while the third is looked at; nobody waits for the third.
    h100, a100, anyone = (
        make_template(world, entrypoint=show_devices(sleep), worker_groups=groups, **flavor)
        for flavor, sleep in (({"gpu_flavor": "h100"}, 15), ({"gpu_flavor": "a100"}, 15), ({}, 0))
    )
    first, second, third = submit(world, h100), submit(world, a100), submit(world, anyone)
    wait_for(first, {"running"})
    wait_for(second, {"running"})
    deadline = time.monotonic() + 60
    while (devices(first) is None or devices(second) is None) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert devices(first) == {"0", "1"}, devices(first)  # h100 only
    assert devices(second) == {"2", "3"}, devices(second)  # a100 only
    assert printed(first, "accelerators") == {"accelerator_type:H100"}
    assert printed(second, "accelerators") == {"accelerator_type:A100"}

    waiting = world.client("developer").get(f"{WS}jobs/{third}/").json()
    assert waiting["state"] == "queued"
    assert "this host's gpu capacity 4" in waiting["queue"]["waiting_for"], waiting["queue"]

    for job_id in (first, second, third):
        job = wait_for(job_id, TERMINAL, timeout=240)
        assert job.state == "succeeded", (job.failure_reason, job.message)
    flavor = world.client("developer").get(f"{WS}jobs/{third}/").json()["gpu_flavor"]
    assert devices(third) == {"h100": {"0", "1"}, "a100": {"2", "3"}}[flavor]
