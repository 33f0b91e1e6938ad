"""Concurrent retries with one Idempotency-Key, on real connections: one object, one answer."""

import threading

import pytest
from django.db import connection

from tests.conftest import build_world
from tests.workspaces.test_idempotency import WORKSPACES, post
from workspaces.models import Workspace


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_create_once():
    world = build_world()
    results, errors = [], []
    barrier = threading.Barrier(4)

    def send():
        try:
            barrier.wait(10)
            response = post(world.client("owner"), WORKSPACES, {"slug": "race"}, "race-key")
            results.append((response.status_code, response.json()["id"]))
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert {status for status, _ in results} == {201}
    assert len({pk for _, pk in results}) == 1
    assert Workspace.objects.filter(slug="race").count() == 1
