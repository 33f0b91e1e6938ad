"""Celery entry points: thin, named, taking ids, safe to run twice (the rows are the truth).

The email tasks are in ``emails.py``, below the code that schedules them.
"""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from config import wakeup
from config.celery import send_many
from outbox.services import DISPATCH_TASK

from . import delivery, dispatch, selectors

# A retry due within this many seconds is scheduled as a delayed task; later ones are found by
# the sweep (so the broker never holds long countdowns).
FOLLOW_UP_WITHIN = 60.0


@shared_task(name=DISPATCH_TASK)
def dispatch_events() -> int:
    """Woken by the outbox: fan undispatched events (and new audit events) out, then drain the
    endpoints that got deliveries."""
    wakeup.woken(DISPATCH_TASK)  # before reading: an event from now on sends a new wake-up
    touched = dispatch.events_dispatch() | dispatch.audit_dispatch()
    send_many(deliver, [(pk,) for pk in sorted(touched)])
    return len(touched)


@shared_task(name="manta.notifications.deliver")
def deliver(endpoint_id: int) -> None:
    next_due = delivery.endpoint_deliver(endpoint_id)
    if next_due is None:
        return
    wait = max(0.0, (next_due - timezone.now()).total_seconds())
    if wait <= FOLLOW_UP_WITHIN:
        deliver.apply_async((endpoint_id,), countdown=wait)


@shared_task(name="manta.notifications.sweep")
def sweep() -> int:
    """The beat's safety net: events whose wake-up was lost, audit events (which wake nothing),
    retries that came due, and deliveries whose worker died (expired lease)."""
    touched = dispatch.events_dispatch() | dispatch.audit_dispatch()
    due = sorted(touched | set(selectors.endpoints_due()))
    send_many(deliver, [(pk,) for pk in due])
    return len(due)
