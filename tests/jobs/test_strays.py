"""The sweep stops local clusters whose attempt is gone or torn down, and only those. The
"clusters" here are real processes carrying a cluster's token, as every Ray process of a local
cluster does; the local launcher's own tests stop real Ray nodes the same way."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from django.utils import timezone

from jobs import sweep
from jobs.launchers import local
from jobs.models import JobAttempt
from tests.jobs.conftest import submit


def fake_cluster(work_dir: str, submission_id: str) -> tuple[dict, subprocess.Popen]:
    cluster_dir = os.path.join(work_dir, f"{local.CLUSTER_DIR_PREFIX}{uuid.uuid4().hex[:6]}")
    os.mkdir(cluster_dir)
    token = uuid.uuid4().hex
    process = subprocess.Popen(
        ["sleep", "300"], env={"RAY_AUTH_TOKEN": token}, start_new_session=True
    )
    handle = {
        "kind": local.KIND,
        "cluster_name": f"c-{submission_id[:8]}",
        "submission_id": submission_id,
        "temp_dir": cluster_dir,
        "token": token,
        "dashboard_url": "",
        "stop_grace_seconds": 0.5,
        "nodes": [{"role": "head", "name": "h", "pid": process.pid, "pgid": process.pid}],
    }
    with open(os.path.join(cluster_dir, local.HANDLE_FILE), "w") as f:
        json.dump(handle, f)
    return handle, process


@pytest.fixture
def work_dir(tmp_path, settings):
    settings.MANTA_LOCAL_RAY_DIR = str(tmp_path)
    return str(tmp_path)


def test_the_sweep_stops_clusters_whose_attempt_ended_and_keeps_the_others(
    world, template, work_dir
):
    job = submit(world, template)
    running = JobAttempt.objects.create(job=job, number=1, cluster_name="a")
    ended = JobAttempt.objects.create(
        job=job, number=2, cluster_name="b", state="cancelled", torn_down_at=timezone.now()
    )
    kept, kept_process = fake_cluster(work_dir, str(running.pk))
    strays = [fake_cluster(work_dir, str(ended.pk)), fake_cluster(work_dir, str(uuid.uuid4()))]
    strays.append(fake_cluster(work_dir, "not-an-attempt"))
    try:
        assert sweep.sweep()["strays"] == 3
        for handle, process in strays:
            assert process.wait(timeout=10) is not None
            assert not os.path.exists(handle["temp_dir"])
        assert kept_process.poll() is None and os.path.isdir(kept["temp_dir"])
        assert sweep.sweep()["strays"] == 0
    finally:
        for _, process in [(kept, kept_process), *strays]:
            process.kill()
            process.wait()
