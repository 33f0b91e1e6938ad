"""Webhook delivery has a Celery queue, and a worker, of its own: with the workers started as
``make worker`` starts them (tests/e2e/conftest.py), a backlog of deliveries to a slow receiver
that keeps every webhook process busy does not hold a job's launch (real Redis, PostgreSQL,
Celery; the job targets a ``ray`` cluster that is not there, so its launch starts and fails at
once: only the dispatch is under test)."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

from audit.context import Actor
from config.celery import app
from jobs import services as job_services
from jobs.models import JobAttempt
from notifications import services as hooks
from notifications.models import WebhookDelivery
from outbox import services as outbox
from tests.conftest import build_world
from tests.e2e.conftest import start_worker
from tests.jobs.conftest import counter_spec
from tests.notifications.conftest import Receiver
from workspaces import compute_targets
from workspaces import services as ws_services

# A launch must not wait behind deliveries: timed, so not while another test loads the CPUs.
pytestmark = [pytest.mark.e2e, pytest.mark.whole_host]

SLOW = 1.0  # seconds the receiver takes to answer each delivery


@pytest.mark.parametrize(
    "task", ["manta.notifications.dispatch", "manta.notifications.deliver",
             "manta.notifications.sweep", "manta.notifications.email_event"],
)  # fmt: skip
def test_notification_tasks_are_routed_to_the_webhooks_queue_by_name(task):
    assert app.amqp.router.route({}, task)["queue"].name == "webhooks"


@pytest.mark.parametrize("task", ["manta.jobs.admit", "manta.jobs.launch_attempt"])
def test_the_job_lifecycle_stays_on_the_default_queue(task):
    assert app.amqp.router.route({}, task)["queue"].name == "celery"


@pytest.fixture(scope="module")
def workers(django_db_setup, django_db_blocker, tmp_path_factory):
    proc = start_worker(
        tmp_path_factory,
        "queues-var",
        WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
        WEBHOOK_ALLOW_HTTP="true",
        WEBHOOK_TIMEOUT_SECONDS="10",
        MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS="127.0.0.0/8",
    )
    yield proc
    proc.stop()


@pytest.fixture
def receiver():
    server = Receiver()

    def slowly(_request):
        time.sleep(SLOW)
        return 200, {}, b"ok"

    server.default = slowly
    yield server
    server.close()


def test_a_backlog_of_slow_deliveries_does_not_delay_a_launch(
    workers, transactional_db, settings, receiver
):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    world = build_world()
    system, owner = Actor.system("test"), Actor.for_user(world.users["owner"])
    for _ in range(4):
        hooks.webhook_create(
            actor=system, organization=world.org, workspace=world.ws, url=receiver.url(),
            event_types=["*"],
        )  # fmt: skip
    compute_targets.compute_target_create(
        actor=system, organization=world.org, name="nowhere", kind="ray",
        config={"address": "http://127.0.0.1:9"},
    )  # fmt: skip
    ws = ws_services.workspace_update(
        actor=system, workspace=world.ws, data={"compute_target": "nowhere"}
    )
    template = job_services.template_create(
        actor=owner, workspace=ws, name="t", spec=counter_spec(worker_groups=[])
    ).template
    # 4 endpoints × 40 events, a second each: minutes of work for the webhook worker
    entry = {"type": "job.succeeded", "organization": world.org, "workspace": ws,
             "payload": {"job": {"id": 0, "name": "backlog"}}}  # fmt: skip
    with transaction.atomic():
        outbox.event_emit_many(entries=[entry] * 40)
    deadline = time.monotonic() + 30
    while len(receiver.requests) < 2:  # both webhook processes are in a slow delivery
        assert time.monotonic() < deadline, "the webhook worker never started delivering"
        time.sleep(0.05)

    submitted = time.monotonic()
    job = job_services.job_submit(
        actor=Actor.for_user(world.users["developer"]), workspace=ws, template=template
    )
    while not JobAttempt.objects.filter(job=job, launch_started_at__isnull=False).exists():
        assert time.monotonic() - submitted < 10, "the launch waited behind the deliveries"
        time.sleep(0.02)
    waited = time.monotonic() - submitted

    # the backlog was still there: the launch went past it, not after it
    assert WebhookDelivery.objects.filter(state="pending").count() > 100
    assert waited < 3 * SLOW, waited
    # Stop the workers before the tables are flushed: a worker still delivering the backlog
    # (or failing the launch) writes while the flush truncates them, and the two deadlock.
    workers.stop()
    connection.close()
