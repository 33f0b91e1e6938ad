"""Webhooks through a real Celery worker (Redis broker, PostgreSQL): an event committed here is
dispatched and delivered by the worker; a worker SIGKILLed in the middle of a delivery loses
nothing — its lease runs out and the restarted worker's sweep sends the message again, with the
same ``webhook-id``."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from audit.context import Actor
from notifications import services
from notifications.models import WebhookAttempt, WebhookDelivery
from outbox import services as outbox
from tests.conftest import build_world
from tests.e2e.conftest import start_worker
from tests.notifications.conftest import Receiver, verify

pytestmark = [pytest.mark.e2e]

LEASE_SECONDS = 8


@pytest.fixture(scope="module")
def webhook_worker(django_db_setup, django_db_blocker, tmp_path_factory):
    proc = start_worker(
        tmp_path_factory,
        "webhook-worker-var",
        WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
        WEBHOOK_ALLOW_HTTP="true",
        WEBHOOK_LEASE_SECONDS=str(LEASE_SECONDS),
        WEBHOOK_TIMEOUT_SECONDS="2",
        WEBHOOK_SWEEP_INTERVAL_SECONDS="1",
        WEBHOOK_RETRY_SCHEDULE="0,1,1,1",
        WEBHOOK_RETRY_JITTER="0",
    )
    yield proc
    proc.stop()


@pytest.fixture
def world(webhook_worker, transactional_db, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True
    yield build_world()
    connection.close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def emit_committed(world, type_: str = "job.succeeded"):
    with transaction.atomic():  # the dispatcher is woken when this commits
        return outbox.event_emit(
            type=type_,
            organization=world.org,
            workspace=world.ws,
            payload={"job": {"id": 1, "name": "e2e"}, "reason": "", "actor": "tests"},
        )


def test_worker_delivers_and_retries(world, receiver):
    receiver.replies = [(500, {}, b"not yet")]
    endpoint, secret = services.webhook_create(
        actor=Actor.for_user(world.users["owner"]),
        organization=world.org,
        workspace=world.ws,
        url=receiver.url(),
        event_types=["job.succeeded"],
    )
    event = emit_committed(world)
    wait_for(lambda: len(receiver.requests) >= 2, 30, "the retry")
    assert [r.headers["webhook-id"] for r in receiver.requests] == [f"msg_{event.pk.hex}"] * 2
    assert all(verify(secret, r.headers, r.body) for r in receiver.requests)
    wait_for(
        lambda: WebhookDelivery.objects.filter(endpoint=endpoint, state="succeeded").exists(),
        10,
        "the delivery to be recorded",
    )


def test_sigkill_during_a_delivery_still_delivers_it(world, receiver, webhook_worker):
    in_flight, release = threading.Event(), threading.Event()

    def hang_until_killed(_request):
        in_flight.set()
        release.wait(30)
        return (200, {}, b"too late")

    receiver.replies = [hang_until_killed]
    endpoint, secret = services.webhook_create(
        actor=Actor.for_user(world.users["owner"]),
        organization=world.org,
        workspace=world.ws,
        url=receiver.url(),
        event_types=["job.failed"],
    )
    event = emit_committed(world, "job.failed")
    assert in_flight.wait(30), "the worker never started the delivery"

    webhook_worker.kill()
    killed_at = time.monotonic()
    release.set()
    row = WebhookDelivery.objects.get(endpoint=endpoint)
    assert row.state == "pending" and row.lease_until is not None  # claimed, never recorded
    assert row.attempts.count() == 0

    webhook_worker.start()
    wait_for(lambda: len(receiver.requests) >= 2, 60, "the redelivery after the kill")
    first, second = receiver.requests[:2]
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == f"msg_{event.pk.hex}"
    assert verify(secret, second.headers, second.body)
    assert second.json == first.json
    # not before the dead worker's lease ran out (a live lease is never stolen)
    assert time.monotonic() - killed_at > LEASE_SECONDS - 3

    row = wait_for(
        lambda: WebhookDelivery.objects.filter(pk=row.pk, state="succeeded").first(),
        10,
        "the delivery to be recorded",
    )
    attempts = list(WebhookAttempt.objects.filter(delivery=row).order_by("started_at", "id"))
    assert ["lost" in a.error for a in attempts] == [True, False]
    assert attempts[-1].status_code == 200
    assert len(receiver.requests) == 2
