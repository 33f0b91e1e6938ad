"""Fan-out from the outbox: which endpoints get which events, the new event types, audit streaming,
and the wake-up on commit."""

from __future__ import annotations

from unittest import mock

from audit.context import Actor
from notifications import dispatch
from notifications.models import WebhookDelivery
from outbox import services as outbox
from outbox.models import DomainEvent
from tests.conftest import SYSTEM
from tests.factories import UserFactory
from workspaces import services as ws_services

from .conftest import emit, make_endpoint, pump


def delivered_types(endpoint) -> list[str]:
    return list(
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .order_by("occurred_at", "id")
        .values_list("event_type", flat=True)
    )


def test_workspace_endpoint_gets_its_workspace_events_org_endpoint_gets_all(world, receiver):
    other_ws = ws_services.workspace_create(actor=SYSTEM, organization=world.org, slug="other")
    ws_hook, _ = make_endpoint(world, receiver.url("/ws"))
    org_hook, _ = make_endpoint(world, receiver.url("/org"), org_level=True)
    only_failed, _ = make_endpoint(world, receiver.url("/failed"), event_types=["job.failed"])
    emit(world, "job.succeeded")
    emit(world, "job.failed", workspace=other_ws)
    emit(world, "job.failed")
    services_event = DomainEvent.objects.create(
        type="job.succeeded", organization=world.other_org, payload={}
    )  # another organisation: nobody here hears it
    dispatch.events_dispatch()

    assert delivered_types(ws_hook) == ["job.succeeded", "job.failed"]
    assert delivered_types(org_hook) == ["job.succeeded", "job.failed", "job.failed"]
    assert delivered_types(only_failed) == ["job.failed"]
    assert not WebhookDelivery.objects.filter(event=services_event).exists()
    assert not DomainEvent.objects.filter(dispatched_at__isnull=True).exists()
    dispatch.events_dispatch()  # a second pass finds nothing to do
    assert WebhookDelivery.objects.count() == 6


def test_disabled_endpoints_get_nothing(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url())
    endpoint.enabled = False
    endpoint.save()
    emit(world)
    dispatch.events_dispatch()
    assert delivered_types(endpoint) == []


def test_bulk_outbox_rows_are_dispatched_and_wake_the_dispatcher_once(
    world, receiver, django_capture_on_commit_callbacks
):
    make_endpoint(world, receiver.url())
    entry = {"type": "job.launching", "organization": world.org, "workspace": world.ws}
    with (
        mock.patch("notifications.tasks.dispatch_events.apply_async") as send,
        django_capture_on_commit_callbacks(execute=True) as callbacks,
    ):
        outbox.event_emit_many(entries=[{**entry, "payload": {}} for _ in range(50)])
        emit(world, "job.running")
    assert len(callbacks) == 1 and send.call_count == 1
    pump()
    assert len(receiver.requests) == 51
    assert {r.json["type"] for r in receiver.requests} == {"job.launching", "job.running"}


def test_membership_and_workspace_events(world, receiver):
    make_endpoint(world, receiver.url(), org_level=True)
    admin = Actor.for_user(world.users["owner"])
    ws = ws_services.workspace_create(actor=admin, organization=world.org, slug="new", name="New")
    user = UserFactory(email="newbie@acme.test", in_org=world.org)
    membership = ws_services.member_add(actor=admin, workspace=ws, email=user.email, role="viewer")
    ws_services.member_remove(actor=admin, membership=membership)
    pump()
    bodies = [r.json for r in receiver.requests]
    assert [b["type"] for b in bodies] == ["workspace.created", "member.added", "member.removed"]
    assert bodies[0]["data"] | {"id": None} == {
        "id": None,
        "organization": "acme",
        "workspace": "new",
        "name": "New",
        "description": "",
        "actor": "owner@acme.test",
    }
    assert bodies[1]["data"]["member"] == {"email": "newbie@acme.test", "role": "viewer"}
    assert bodies[2]["data"]["member"] == {"email": "newbie@acme.test", "role": "viewer"}


def test_template_and_job_events_from_the_jobs_layer(world, receiver, template):
    # ``template`` (tests/conftest.py) was published before this endpoint existed
    from jobs import services as job_services

    endpoint, _ = make_endpoint(world, receiver.url())
    admin = Actor.for_user(world.users["ws_admin"])
    job_services.template_update(actor=admin, template=template, spec_changes={"priority": 9})
    pump()
    body = receiver.requests[-1].json
    assert body["type"] == "template.version_created"
    assert body["data"]["template"] == {"id": template.pk, "name": "counter", "version": 2}
    assert delivered_types(endpoint) == ["template.version_created"]


def test_audit_stream_from_subscription_on(world, receiver):
    stream, _ = make_endpoint(
        world, receiver.url("/siem"), org_level=True, event_types=["audit.event"]
    )
    plain, _ = make_endpoint(world, receiver.url("/all"), org_level=True)
    pump()  # history before the subscription is not sent; what followed it is
    assert [(r.path, r.json["data"]["action"]) for r in receiver.requests] == [
        ("/siem", "webhook.create")
    ]
    receiver.requests.clear()
    ws_services.workspace_update(
        actor=Actor.for_user(world.users["owner"]), workspace=world.ws, data={"name": "ML 2"}
    )
    pump()
    audit_bodies = [r.json for r in receiver.requests if r.path == "/siem"]
    assert [b["type"] for b in audit_bodies] == ["audit.event"]
    data = audit_bodies[0]["data"]
    assert data["action"] == "workspace.update"
    assert data["actor"] == {"type": "user", "label": "owner@acme.test"}
    assert data["changes"] == {"name": ["ML", "ML 2"]}
    assert data["workspace"] == "ml" and data["organization"] == "acme"
    assert not [r for r in receiver.requests if r.path == "/all"]  # "*" excludes audit.event
    stream.refresh_from_db()
    assert stream.audit_cursor == data["seq"]
    assert delivered_types(plain) == []
