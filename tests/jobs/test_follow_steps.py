"""How often a submitted attempt is followed: quickly while Ray has not yet started its driver
(so that the move to running is seen soon after Ray says RUNNING), backing off with the time
it takes, and at MANTA_FOLLOW_INTERVAL_SECONDS once the job runs. The cluster is a RayJob on
``KubeStub``, which stands in for the Kubernetes API server (outside the system): the test sets
the status KubeRay would."""

import datetime as dt

import pytest

from jobs import following, launching
from jobs.models import JobAttempt
from tests.jobs.test_kuberay_orphans import kuberay_attempt, stub  # noqa: F401

PENDING = {"jobStatus": "PENDING", "jobDeploymentStatus": "Running", "message": "queued"}
RUNNING = {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}


def step(attempt: JobAttempt) -> float | None:
    attempt.refresh_from_db()
    return following.attempt_follow(str(attempt.pk), attempt.follow_token)


def submitted_ago(attempt: JobAttempt, seconds: float) -> None:
    JobAttempt.objects.filter(pk=attempt.pk).update(
        submitted_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    )


def test_follow_steps_are_quick_until_the_driver_runs_then_the_interval(
    kuberay_attempt,  # noqa: F811
    stub,  # noqa: F811
    settings,
):
    settings.MANTA_FOLLOW_INTERVAL_SECONDS = 2.0
    attempt = kuberay_attempt
    launching.attempt_launch(str(attempt.pk))
    attempt.refresh_from_db()
    assert attempt.submitted and attempt.job.state == "launching"
    [(namespace, name)] = stub.rayjobs
    stub.set_rayjob_status(namespace, name, PENDING)

    assert step(attempt) == pytest.approx(0.1)  # just submitted
    submitted_ago(attempt, 5)
    assert step(attempt) == pytest.approx(0.5, abs=0.02)  # a tenth of the wait so far
    submitted_ago(attempt, 60)
    assert step(attempt) == 2.0  # never slower than the interval

    stub.set_rayjob_status(namespace, name, RUNNING)
    assert step(attempt) == 2.0
    attempt.refresh_from_db()
    assert attempt.job.state == "running" and attempt.running_at is not None
    assert step(attempt) == 2.0

    stub.set_rayjob_status(
        namespace, name, {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"}
    )
    assert step(attempt) is None  # over: nothing more to follow
