"""The outbox: a row is only data; ``event_emit`` writes it and wakes the dispatcher on commit."""

from __future__ import annotations

import datetime as dt
from unittest import mock

from outbox import services
from outbox.models import DomainEvent


def test_writing_a_row_does_nothing_else(world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        DomainEvent.objects.create(type="job.queued", organization=world.org, payload={})
        DomainEvent.objects.bulk_create(
            [DomainEvent(type="job.queued", organization=world.org) for _ in range(3)]
        )
    assert callbacks == []


def test_event_emit_wakes_the_dispatcher_once_per_transaction(
    world, django_capture_on_commit_callbacks
):
    entry = {"type": "job.queued", "organization": world.org, "workspace": world.ws}
    with (
        mock.patch("notifications.tasks.dispatch_events.apply_async") as send,
        django_capture_on_commit_callbacks(execute=True) as callbacks,
    ):
        services.event_emit(**entry, payload={"n": 1})
        services.event_emit_many(entries=[{**entry, "payload": {"n": n}} for n in range(30)])
        assert services.event_emit_many(entries=[]) == []
    assert len(callbacks) == 1 and send.call_count == 1
    assert DomainEvent.objects.filter(type="job.queued", workspace=world.ws).count() == 31


def test_payloads_are_stored_as_the_json_they_read_back_as(world):
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    entries = [
        {"type": "job.queued", "organization": world.org, "payload": {"at": when, "n": n}}
        for n in range(25)  # past config.db.COPY_ABOVE: written with COPY
    ]
    (one,) = services.event_emit_many(entries=entries[:1])
    many = services.event_emit_many(entries=entries)
    stored = DomainEvent.objects.get(pk=one.pk).payload
    assert stored == one.payload == {"at": "2026-01-02 03:04:05+00:00", "n": 0}
    assert DomainEvent.objects.get(pk=many[-1].pk).payload == many[-1].payload
