"""A committed write never answers 5xx because the broker is away: the task it would have sent
is logged as lost and the sweep finds the work (a queued job, an attempt without heartbeat)."""

import pytest
from django.db import connection
from kombu import pools as kombu_pools

from config.celery import app
from jobs.models import Job
from tests.conftest import build_world
from tests.jobs.conftest import counter_spec

WS = "/api/v1/orgs/acme/workspaces/ml/"


@pytest.fixture
def broker_away():
    """Point the Celery app at a port nothing listens on (the discard port), for real."""
    previous = app.conf.broker_url
    app.pool.force_close_all()
    app._pool = None
    app.conf.broker_url = "redis://127.0.0.1:9/0"
    app.amqp._producer_pool = None
    yield
    app.pool.force_close_all()
    # kombu keeps its connection and producer pools per broker address for the process: the
    # closed ones would refuse every later test's sends
    kombu_pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    app.conf.broker_url = previous


def test_submit_and_cancel_commit_and_answer_while_the_broker_is_away(
    transactional_db, broker_away, caplog
):
    world = build_world()
    admin, developer = world.client("ws_admin"), world.client("developer")
    body = {"name": "t", **counter_spec()}
    template = admin.post(WS + "templates/", body, format="json").json()["id"]
    response = developer.post(WS + "jobs/", {"template": template}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    # admitted by the request itself (one hop, jobs/dispatch.py) where the queue allowed: its
    # launch task is what was lost, and the sweep sends it again
    assert job.state in ("queued", "pending_approval", "launching")
    cancel = developer.post(f"{WS}jobs/{job.pk}/cancel/", {}, format="json")
    assert cancel.status_code == 200 and cancel.json()["state"] == "cancelled"
    assert "Error calling" in caplog.text  # Django's log of a robust on_commit callback
    connection.close()
