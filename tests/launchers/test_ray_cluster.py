"""The ``ray`` launcher against a real, already running Ray cluster (started here with the local
launcher, standing in for a long-running shared cluster): submit, status, logs, stop — and no
cluster lifecycle of its own."""

import socket
import time
import uuid

import pytest

from config import ssrf
from jobs.launchers.base import LaunchError, LaunchRequest, launch
from jobs.launchers.local import LocalRayLauncher
from jobs.launchers.ray_cluster import RayClusterLauncher

pytestmark = pytest.mark.ray

SPEC = {
    "entrypoint": "python -c \"import ray, time; ray.init(); print('hello from ray'); "
    'time.sleep(60)"',
    "head": {"cpu": 1, "memory_gb": 1, "gpu": 0},
    "worker_groups": [],
    "runtime_env": {"env_vars": {"GREETING": "hi"}},
}


def request(cluster_name="shared", entrypoint=None):
    spec = {**SPEC, "entrypoint": entrypoint or SPEC["entrypoint"]}
    return LaunchRequest(
        submission_id=str(uuid.uuid4()),
        cluster_name=cluster_name,
        spec=spec,
        labels={"manta.dev/job": "1"},
        target_config={"work_dir": "/tmp/mrt"},
    )


@pytest.fixture(scope="module")
def shared_cluster():
    local = LocalRayLauncher()
    handle = local.start_cluster(request())
    yield handle
    local.stop(handle)


def target(cluster):
    # The stand-in cluster listens on this host's loopback: the operator allows it.
    return {
        "address": cluster["dashboard_url"],
        "token": cluster["token"],
        "allowed_networks": ["127.0.0.0/8"],
    }


def wait(launcher, handle, statuses, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = launcher.status(handle)
        if state.status in statuses:
            return state
        time.sleep(0.3)
    raise AssertionError(f"still {state.status}")


def test_submit_follow_logs_stop(shared_cluster):
    launcher = RayClusterLauncher(target(shared_cluster))
    req = request()
    plan = launcher.plan(req)
    assert plan["kind"] == "ray" and plan["submission"]["submission_id"] == req.submission_id
    # the driver asks Ray for the head's spec
    assert plan["submission"]["entrypoint_num_cpus"] == 1
    assert plan["submission"]["entrypoint_memory"] == 1024**3
    handle = launch(launcher, req)
    assert launch(launcher, req) == handle  # a repeated launch adopts the same Ray job
    wait(launcher, handle, {"RUNNING"})
    deadline = time.monotonic() + 30
    while "hello from ray" not in launcher.logs(handle) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert "hello from ray" in launcher.logs(handle, tail=5)
    launcher.stop(handle)
    assert wait(launcher, handle, {"STOPPED"}).status == "STOPPED"
    # the cluster itself is untouched: another job still runs on it
    other = launch(launcher, request(entrypoint="python -c \"print('second')\""))
    assert wait(launcher, other, {"SUCCEEDED", "FAILED"}).status == "SUCCEEDED"


def test_wrong_token_is_refused(shared_cluster):
    launcher = RayClusterLauncher({**target(shared_cluster), "token": "nope"})
    with pytest.raises(LaunchError):
        launch(launcher, request())


def test_an_address_outside_the_allowed_networks_is_refused_at_every_connection(
    shared_cluster, monkeypatch
):
    """The same cluster, but the operator allows no internal network: the worker never sends
    a request there. A name checked at save that resolves to loopback later is refused too."""
    launcher = RayClusterLauncher({**target(shared_cluster), "allowed_networks": []})
    with pytest.raises(LaunchError, match="loopback"):
        launch(launcher, request())
    port = shared_cluster["dashboard_url"].rsplit(":", 1)[1]
    answers = {"ray.example.test": "93.184.216.34"}

    def resolve(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(ssrf, "getaddrinfo", resolve)
    named = RayClusterLauncher(
        {"address": f"http://ray.example.test:{port}", "token": shared_cluster["token"]}
    )
    answers["ray.example.test"] = "127.0.0.1"  # rebound after the target was saved
    with pytest.raises(LaunchError, match=r"resolves to 127\.0\.0\.1, which is a loopback"):
        named.status({"submission_id": "x"})
