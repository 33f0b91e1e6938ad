"""Writing the outbox: the one way a domain event is recorded.

Callers are inside the transaction of the change an event describes. Once it commits, the
dispatcher is woken to fan the events out; the beat's sweep finds any whose wake-up was lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from config import wakeup
from config.celery import app
from config.db import copy_insert

from .models import DomainEvent

# The dispatcher (notifications/tasks.py) sits above every app that writes here, so the outbox
# wakes it by its task name instead of importing it.
DISPATCH_TASK = "manta.notifications.dispatch"


def event_emit(
    *, type: str, organization: Any, workspace: Any = None, payload: dict[str, Any]
) -> DomainEvent:
    """Append a domain event to the outbox (in the caller's transaction) and wake the
    dispatcher once that transaction commits."""
    entry = {"type": type, "organization": organization, "workspace": workspace, "payload": payload}
    return event_emit_many(entries=[entry])[0]


def event_emit_many(*, entries: Iterable[dict[str, Any]]) -> list[DomainEvent]:
    """:func:`event_emit` for many events at once, in one insert (COPY on PostgreSQL: an
    admission pass writes thousands). Each entry takes the keyword arguments of
    :func:`event_emit`."""
    events = copy_insert(
        DomainEvent,
        (
            DomainEvent(
                type=entry["type"],
                organization=entry["organization"],
                workspace=entry.get("workspace"),
                payload=json.loads(json.dumps(entry["payload"], default=str)),
            )
            for entry in entries
        ),
    )
    if events:
        _dispatch_on_commit()
    return events


def _dispatch_on_commit() -> None:
    """Wake the dispatcher after the current transaction commits — once per transaction, however
    many events it writes (the marker is the connection's list of commit hooks, which Django
    replaces on every commit and rollback)."""
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        if getattr(connection, "_manta_dispatch_marker", None) is connection.run_on_commit:
            return
        connection._manta_dispatch_marker = connection.run_on_commit
    # robust: a broker that is away must not turn a committed change into an error.
    transaction.on_commit(_dispatch_send, robust=True)


def _dispatch_send() -> None:
    # A signature runs the task registered under that name when this process has it (eagerly,
    # if Celery is set to) and otherwise sends the message by name.
    # Not when a wake-up is already on its way: the dispatcher it starts has not read yet.
    wakeup.wake(DISPATCH_TASK, app.signature(DISPATCH_TASK).delay)
