"""A kuberay start whose handle never reached the attempt row (the launch was killed, or the job
was cancelled, in between) leaves a RayJob no row points to; ending the attempt finds it by its
request and deletes it. The Kubernetes API server is outside the system: ``KubeStub`` stands in
for it on 127.0.0.1."""

import dataclasses

import pytest

from jobs import admission, following
from jobs.launch_requests import launch_request, resolve_target
from jobs.launchers import launcher_for
from jobs.models import JobAttempt
from tests.jobs.conftest import submit
from tests.launchers.kube_stub import KubeStub

TARGETS = "/api/v1/orgs/acme/compute-targets/"
WS = "/api/v1/orgs/acme/workspaces/ml/"


@pytest.fixture
def stub():
    with KubeStub() as server:
        yield server


@pytest.fixture
def kuberay_attempt(world, template, stub):
    body = {"name": "k8s", "kind": "kuberay", "config": {"kubeconfig": stub.kubeconfig()}}
    assert world.client("owner").post(TARGETS, body, format="json").status_code == 201
    world.client("owner").patch(WS, {"compute_target": "k8s"}, format="json")
    world.ws.refresh_from_db()
    job = submit(world, template)
    assert admission.admit(world.org.pk) == [job.pk]
    return JobAttempt.objects.select_related("job").get(job=job)


def test_teardown_deletes_the_rayjob_a_start_left_without_a_handle(kuberay_attempt, stub):
    attempt = kuberay_attempt
    target = resolve_target(attempt.job)
    launcher = launcher_for(target.kind, target.config)
    launcher.start_cluster(launch_request(attempt, target))  # then the worker died
    assert attempt.handle_encrypted in ("", None)
    [(namespace, name)] = stub.rayjobs
    assert name == attempt.cluster_name

    following.attempt_teardown(attempt)
    assert stub.rayjobs == {}
    assert stub.requests_to("DELETE", f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}")
    attempt.refresh_from_db()
    assert attempt.torn_down_at is not None


def test_a_rayjob_of_another_submission_is_left_alone(kuberay_attempt, stub):
    attempt = kuberay_attempt
    target = resolve_target(attempt.job)
    request = launch_request(attempt, target)
    foreign = dataclasses.replace(request, submission_id="someone-else")
    launcher_for(target.kind, target.config).start_cluster(foreign)
    assert launcher_for(target.kind, target.config).find_started(request) == []
    following.attempt_teardown(attempt)
    assert len(stub.rayjobs) == 1
