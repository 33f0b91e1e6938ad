"""Concurrent retries with one Idempotency-Key, on real connections: one object, one answer."""

import threading

import pytest
from django.db import connection

from audit.context import Actor
from jobs import services as job_services
from jobs.models import Job
from tests.conftest import build_world
from tests.jobs.conftest import counter_spec
from tests.workspaces.test_idempotency import WORKSPACES, post
from workspaces.models import Workspace

JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"


def send_at_once(world, who, path, body, key, copies=4):
    """(status, replayed, id) of each of ``copies`` identical requests sent together."""
    results, errors = [], []
    barrier = threading.Barrier(copies)

    def send():
        try:
            barrier.wait(10)
            response = post(world.client(who), path, body, key)
            replayed = response.get("Idempotent-Replayed") == "true"
            results.append((response.status_code, replayed, response.json()["id"]))
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_create_once():
    world = build_world()
    results = send_at_once(world, "owner", WORKSPACES, {"slug": "race"}, "race-key")
    assert {(status, replayed) for status, replayed, _ in results} == {(201, False), (201, True)}
    assert len({pk for _, _, pk in results}) == 1
    assert Workspace.objects.filter(slug="race").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_job_submissions_with_one_key_submit_once():
    world = build_world()
    template = job_services.template_create(
        actor=Actor.for_user(world.users["ws_admin"]),
        workspace=world.ws,
        name="counter",
        spec=counter_spec(),
    ).template
    body = {"template": template.pk, "name": "once"}
    results = send_at_once(world, "developer", JOBS, body, "submit-key")
    assert sorted((status, replayed) for status, replayed, _ in results) == [
        (200, True),
        (200, True),
        (200, True),
        (201, False),
    ]
    assert len({pk for _, _, pk in results}) == 1
    assert Job.objects.count() == 1
