"""The launcher contract (``jobs/launchers/base.py``), checked the same way on all three launchers.

* ``local``: real Ray. One small cluster (a head node, no workers) is started once, through the
  contract's ``start_cluster``, and every check submits its own job to it; the last check stops it.
* ``ray``: the same running cluster, reached as an existing, shared cluster (address + token),
  the way ``test_ray_cluster.py`` does. Its checks run before ``local``'s (the order of the
  ``subject`` params), so the cluster is still up; it is started again if it is not.
* ``kuberay``: the stub API server (``kube_stub.py``). KubeRay does not run, so ``finish`` writes
  what it would: the RayJob's final status and the submitter pod's log.

The launcher used for the checks that must hold from another process is a fresh one from
``launcher_for`` with a handle that went through JSON, as a Celery worker would have it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobs.launchers import cluster_text, launcher_for, ray_jobs
from jobs.launchers.base import RAY_SUCCEEDED, RAY_TERMINAL, Launcher, LaunchError, LaunchRequest
from jobs.launchers.local import LocalRayLauncher
from tests.launchers.kube_stub import KubeStub

TIMEOUT = 90
LABELS = {"manta.dev/org": "acme", "manta.dev/workspace": "ml", "manta.dev/job": "7"}


def spec(entrypoint: str) -> dict[str, Any]:
    return {
        "image": "rayproject/ray:2.60.0",
        "entrypoint": entrypoint,
        "runtime_env": {"env_vars": {"MANTA_CONTRACT": "1"}},
        "head": {"cpu": 0, "memory_gb": 1, "gpu": 0},
        "worker_groups": [],
    }


def say(text: str) -> str:
    return f"python -c \"print('{text}')\""


@dataclasses.dataclass
class Subject:
    """One launcher under test and what the checks need to know about its world."""

    kind: str
    target_config: dict[str, Any]
    launcher: Launcher
    # A handle for ``request``, as start_cluster() gives it (local: the shared cluster's).
    start: Callable[[LaunchRequest], dict[str, Any]]
    # A request start_cluster() was called with, and the handle it returned.
    started: Callable[[], tuple[LaunchRequest, dict[str, Any]]]
    # What the cluster does by itself once a job ran and printed ``log`` (kuberay only).
    finish: Callable[[dict[str, Any], str], None]
    # How many jobs the cluster holds under a submission id.
    jobs: Callable[[str], int]
    # Something plan() must leave unchanged.
    snapshot: Callable[[], Any]

    def request(self, name: str, entrypoint: str) -> LaunchRequest:
        # The kind in the id: ray and local share one Ray cluster, whose job ids must differ.
        return LaunchRequest(
            submission_id=f"{self.kind}-{name}",
            cluster_name=f"manta-{self.kind}-{name}",
            spec=spec(entrypoint),
            labels=dict(LABELS),
            target_config=dict(self.target_config),
        )

    def other_process(self) -> Launcher:
        return launcher_for(self.kind, self.target_config)

    def wait_terminal(self, handle: dict[str, Any]) -> Any:
        deadline = time.monotonic() + TIMEOUT
        while (state := self.launcher.status(handle)).status not in RAY_TERMINAL:
            assert time.monotonic() < deadline, f"job still {state.status}"
            time.sleep(0.3)
        return state


# -- the worlds --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def work_dir() -> Iterator[str]:
    # Short: Ray's unix socket paths live below it.
    path = tempfile.mkdtemp(prefix="mc-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


class SharedCluster:
    """The module's one local Ray cluster, started through the contract when first asked for
    (and again if a check stopped it before another needed it)."""

    def __init__(self, work_dir: str) -> None:
        self.config = {
            "work_dir": work_dir,
            "stop_grace_seconds": 1,
            "sandbox": {"mode": "sandbox"},
        }
        self.request = LaunchRequest(
            submission_id="contract-cluster",
            cluster_name="manta-contract-cluster",
            spec=spec("true"),
            labels=dict(LABELS),
            target_config=self.config,
        )
        self.launcher = LocalRayLauncher()
        self._handle: dict[str, Any] | None = None

    def handle(self) -> dict[str, Any]:
        if self._handle is None or not self.launcher.is_alive(self._handle):
            self._handle = self.launcher.start_cluster(self.request)
        return self._handle

    def close(self) -> None:
        if self._handle is not None:
            self.launcher.stop(self._handle)


@pytest.fixture(scope="module")
def shared_cluster(work_dir: str) -> Iterator[SharedCluster]:
    cluster = SharedCluster(work_dir)
    yield cluster
    cluster.close()


def ray_jobs_named(handle: dict[str, Any], submission_id: str) -> int:
    client = ray_jobs.make_client(handle["dashboard_url"], handle["token"])
    return [job.submission_id for job in client.list_jobs()].count(submission_id)


def local_subject(cluster: SharedCluster) -> Subject:
    def start(request: LaunchRequest) -> dict[str, Any]:
        # Every check runs its own job on the one cluster: its handle, pointed at that job.
        return {**cluster.handle(), "submission_id": request.submission_id}

    return Subject(
        kind="local",
        target_config=cluster.config,
        launcher=cluster.launcher,
        start=start,
        started=lambda: (cluster.request, cluster.handle()),
        finish=lambda handle, log: None,
        jobs=lambda sid: ray_jobs_named(cluster.handle(), sid),
        snapshot=lambda: sorted(os.listdir(cluster.config["work_dir"])),
    )


def ray_subject(cluster: SharedCluster) -> Subject:
    handle = cluster.handle()
    config = {
        "address": handle["dashboard_url"],
        "token": handle["token"],
        "allowed_networks": ["127.0.0.0/8"],
    }
    launcher = launcher_for("ray", config)
    client = ray_jobs.make_client(handle["dashboard_url"], handle["token"])
    return Subject(
        kind="ray",
        target_config=config,
        launcher=launcher,
        start=launcher.start_cluster,
        started=lambda: started(launcher, config),
        finish=lambda handle, log: None,
        jobs=lambda sid: ray_jobs_named(handle, sid),
        snapshot=lambda: sorted(job.submission_id or "" for job in client.list_jobs()),
    )


def started(launcher: Launcher, config: dict[str, Any]) -> tuple[LaunchRequest, dict[str, Any]]:
    request = LaunchRequest(
        submission_id="contract-again",
        cluster_name="manta-contract-again",
        spec=spec(say("again")),
        labels=dict(LABELS),
        target_config=config,
    )
    return request, launcher.start_cluster(request)


def kuberay_subject(stub: KubeStub) -> Subject:
    config = {"kubeconfig": stub.kubeconfig(), "request_timeout_seconds": 5}
    launcher = launcher_for("kuberay", config)

    def finish(handle: dict[str, Any], log: str) -> None:
        namespace, name = handle["namespace"], handle["name"]
        stub.set_rayjob_status(
            namespace, name, {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"}
        )
        stub.add_pod(
            namespace,
            f"{name}-submit",
            labels={"job-name": name, **LABELS},
            created=datetime.datetime.now(datetime.UTC),
            logs={"ray-job-submitter": log},
        )

    def jobs(sid: str) -> int:
        with stub.lock:
            return sum(1 for job in stub.rayjobs.values() if job["spec"]["jobId"] == sid)

    return Subject(
        kind="kuberay",
        target_config=config,
        launcher=launcher,
        start=launcher.start_cluster,
        started=lambda: started(launcher, config),
        finish=finish,
        jobs=jobs,
        snapshot=lambda: len(stub.requests),
    )


# kuberay first (no Ray), then ray, then local, whose last check stops the shared cluster.
@pytest.fixture(
    scope="module",
    params=[
        "kuberay",
        pytest.param("ray", marks=pytest.mark.ray),
        pytest.param("local", marks=pytest.mark.ray),
    ],
)
def subject(request: pytest.FixtureRequest, work_dir: str) -> Iterator[Subject]:
    if request.param == "kuberay":
        with KubeStub() as stub:
            yield kuberay_subject(stub)
        return
    cluster = request.getfixturevalue("shared_cluster")
    yield ray_subject(cluster) if request.param == "ray" else local_subject(cluster)


@pytest.fixture(scope="module")
def finished(subject: Subject) -> tuple[dict[str, Any], Any]:
    """A trivial job run to its end: (its handle, its final state)."""
    request = subject.request("hello", say("hello from the contract"))
    handle = subject.start(request)
    subject.launcher.submit(handle, request)
    subject.finish(handle, "hello from the contract\n")
    return handle, subject.wait_terminal(handle)


# -- the checks --------------------------------------------------------------------------------


def test_plan_starts_nothing(subject: Subject) -> None:
    before = subject.snapshot()
    plan = subject.launcher.plan(subject.request("plan", say("planned")))
    assert plan["kind"] == subject.kind == subject.launcher.kind
    assert json.loads(json.dumps(plan)) == plan
    assert subject.snapshot() == before


def test_start_cluster_again_adopts_what_runs(subject: Subject) -> None:
    request, first = subject.started()
    before = subject.launcher.find_clusters(subject.target_config)
    # A retried task whose first try died before it could store the handle.
    again = subject.other_process().start_cluster(request)
    assert again == first
    assert subject.launcher.find_clusters(subject.target_config) == before
    assert subject.jobs(request.submission_id) <= 1


def test_submitted_job_reaches_a_terminal_state(
    subject: Subject, finished: tuple[dict[str, Any], Any]
) -> None:
    handle, state = finished
    assert state.status == RAY_SUCCEEDED, subject.launcher.logs(handle)
    assert json.loads(json.dumps(handle)) == handle
    # From another process, with the stored handle, the answer is the same.
    assert subject.other_process().status(json.loads(json.dumps(handle))).status == RAY_SUCCEEDED


def test_logs_return_the_driver_output(
    subject: Subject, finished: tuple[dict[str, Any], Any]
) -> None:
    handle, _ = finished
    logs = subject.launcher.logs(handle)
    assert isinstance(logs, str) and "hello from the contract" in logs
    assert subject.launcher.logs(handle, tail=1).strip() == "hello from the contract"
    followed = "".join(subject.other_process().follow_logs(handle))
    assert "hello from the contract" in followed
    # A part of the log knows where it lies in the whole, in bytes; from its end or by range.
    whole = subject.launcher.log_part(handle, limit=2**20)
    assert whole.start == 0 and whole.end == cluster_text.width(whole.text)
    assert whole.text.endswith("hello from the contract\n")
    end = subject.other_process().log_part(json.loads(json.dumps(handle)), limit=9)
    assert (end.text, end.start, end.end) == ("contract\n", whole.end - 9, whole.end)
    middle = subject.launcher.log_part(handle, since=whole.end - 9, limit=4)
    assert (middle.text, middle.start, middle.end) == ("cont", whole.end - 9, whole.end - 5)


def test_submitting_twice_adopts_the_job(subject: Subject) -> None:
    request = subject.request("twice", say("once"))
    handle = subject.start(request)
    assert subject.launcher.submit(handle, request) == handle
    # A retried task in another worker: a new launcher, the stored handle.
    stored = json.loads(json.dumps(handle))
    assert subject.other_process().submit(stored, request) == stored
    subject.finish(handle, "once\n")
    assert subject.wait_terminal(handle).status == RAY_SUCCEEDED
    assert subject.jobs(request.submission_id) == 1
    assert subject.launcher.logs(handle).splitlines().count("once") == 1


def test_heal_with_nothing_dead_restarts_nothing(
    subject: Subject, finished: tuple[dict[str, Any], Any]
) -> None:
    handle, _ = finished
    assert subject.launcher.heal(dict(handle), max_restarts=1) == []


def test_find_started_and_find_clusters_find_what_a_start_left(subject: Subject) -> None:
    request, handle = subject.started()
    found = subject.other_process().find_started(request)
    assert json.loads(json.dumps(found)) == found
    if subject.kind == "ray":  # starts nothing: a Ray job exists only after submit
        assert found == []
    else:
        [again] = found
        assert again["submission_id"] == request.submission_id == handle["submission_id"]
    nobody = dataclasses.replace(request, submission_id="nobody")
    assert subject.launcher.find_started(nobody) == []
    listed = subject.launcher.find_clusters(subject.target_config)
    assert isinstance(listed, list) and json.loads(json.dumps(listed)) == listed
    if subject.kind == "local":  # the one launcher whose clusters are listed by their files
        assert [cluster["submission_id"] for cluster in listed] == [request.submission_id]
    else:
        assert listed == []


def test_stop_is_idempotent(subject: Subject) -> None:
    request = subject.request("stop", 'python -c "import time; time.sleep(120)"')
    handle = subject.start(request)
    subject.launcher.submit(handle, request)
    subject.launcher.stop(handle)
    subject.other_process().stop(json.loads(json.dumps(handle)))
    # Stopped: the job ends (or its cluster is gone), and nothing is left to find.
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            if subject.launcher.status(handle).status in RAY_TERMINAL:
                break
        except LaunchError:
            break
        assert time.monotonic() < deadline, "the job outlived stop()"
        time.sleep(0.3)
    assert subject.launcher.find_clusters(subject.target_config) == []
