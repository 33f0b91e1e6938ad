"""Email notifications, sent after the dispatcher's commit through Django's email backend."""

from __future__ import annotations

import pytest
from django.core import mail

from audit.context import Actor
from jobs import services as job_services
from notifications import dispatch
from workspaces.identity import notification_preferences_update

from .conftest import emit


@pytest.fixture
def run(django_capture_on_commit_callbacks, eager_tasks):
    def dispatch_and_send():
        with django_capture_on_commit_callbacks(execute=True):
            dispatch.events_dispatch()

    return dispatch_and_send


def recipients(word: str) -> list[str]:
    return sorted(m.to[0] for m in mail.outbox if word in m.subject)


def test_approvers_hear_of_a_job_waiting_for_them(world, template, run):
    world.ws.approval_policy = "always"
    world.ws.save()
    dev = world.users["developer"]
    job = job_services.job_submit(actor=Actor.for_user(dev), workspace=world.ws, template=template)
    run()
    assert recipients("Approval requested") == [
        "admin@acme.test",
        "owner@acme.test",
        "wsadmin@acme.test",
    ]
    message = next(m for m in mail.outbox if "Approval requested" in m.subject)
    assert f"job {job.pk}" in message.subject
    assert "dev@acme.test submitted" in message.body


def test_the_submitter_is_not_asked_to_approve_their_own_job(world, template, run):
    world.ws.approval_policy = "always"
    world.ws.save()
    job_services.job_submit(
        actor=Actor.for_user(world.users["ws_admin"]), workspace=world.ws, template=template
    )
    run()
    assert "wsadmin@acme.test" not in recipients("Approval requested")


def test_submitter_hears_of_a_failed_job(world, run):
    job = {"id": 5, "name": "etl", "submitted_by": "dev@acme.test", "failure_reason": "exit 1"}
    emit(world, "job.failed", job=job, message="Traceback …", reason="", actor="system:x")
    emit(world, "job.succeeded", job=job)
    run()
    assert recipients("Job failed") == ["dev@acme.test"]
    assert len(mail.outbox) == 1
    assert "exit 1" in mail.outbox[0].body


def test_opted_out_users_get_nothing(world, run):
    notification_preferences_update(
        actor=Actor.for_user(world.users["developer"]),
        user=world.users["developer"],
        preferences={"job_failed": False},
    )
    emit(world, "job.failed", job={"id": 5, "name": "etl", "submitted_by": "dev@acme.test"})
    run()
    assert mail.outbox == []
