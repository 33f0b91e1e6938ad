"""The dispatcher: from the outbox (and the audit chain) to delivery rows.

Woken once per committed transaction that wrote outbox rows (``outbox.services.event_emit``) and
by the beat sweep, it takes undispatched events in batches with ``FOR UPDATE SKIP LOCKED`` — so any
number of dispatchers can run at once without fanning an event out twice — creates one delivery
per matching enabled endpoint, marks the events dispatched and schedules the email rules, all in
one transaction. Then the endpoints that got deliveries are drained by delivery tasks.

``audit.event`` is not written to the outbox: the audit table already is an ordered, per-org
stream (its hash chain's ``seq`` is assigned under the chain's row lock, so it grows in commit
order). Each org endpoint that subscribes to it keeps a cursor (``audit_cursor``) into its org's
chain; the hot paths that write audit events pay nothing for the streaming.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from audit.chain import org_chain
from audit.models import AuditEvent
from outbox.models import DomainEvent

from . import emails
from .events import AUDIT_EVENT
from .models import DeliveryState, WebhookDelivery, WebhookEndpoint

log = logging.getLogger(__name__)

BATCH = 500


def message_id_for_event(event_id) -> str:
    return f"msg_{event_id.hex}"


def events_dispatch(*, batch: int = BATCH) -> set[int]:
    """Fan every undispatched domain event out; return the ids of endpoints that got work."""
    touched: set[int] = set()
    while True:
        with transaction.atomic():
            events = list(
                DomainEvent.objects.select_for_update(skip_locked=True)
                .filter(dispatched_at__isnull=True)
                .order_by("occurred_at", "id")
                .only("id", "type", "organization_id", "workspace_id", "occurred_at")[:batch]
            )
            if not events:
                return touched
            endpoints = list(
                WebhookEndpoint.objects.filter(
                    organization_id__in={e.organization_id for e in events}, enabled=True
                ).only("id", "organization_id", "workspace_id", "event_types", "created_at")
            )
            now = timezone.now()
            deliveries = [
                WebhookDelivery(
                    endpoint_id=endpoint.pk,
                    event_id=event.pk,
                    event_type=event.type,
                    occurred_at=event.occurred_at,
                    message_id=message_id_for_event(event.pk),
                    state=DeliveryState.PENDING,
                    next_attempt_at=now,
                )
                for event in events
                for endpoint in endpoints
                if endpoint.organization_id == event.organization_id
                and endpoint.workspace_id in (None, event.workspace_id)
                and endpoint.subscribes(event.type)
                and endpoint.created_at <= event.occurred_at  # events from its creation on
            ]
            WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
            DomainEvent.objects.filter(pk__in=[e.pk for e in events]).update(dispatched_at=now)
            for event in events:
                if event.type in emails.RULES:
                    emails.schedule_for_event(event.pk)
            touched.update(d.endpoint_id for d in deliveries)
        if len(events) < batch:
            return touched


def audit_dispatch(*, batch: int = BATCH) -> set[int]:
    """Advance every ``audit.event`` subscriber's cursor over its organisation's audit chain."""
    touched: set[int] = set()
    candidates = WebhookEndpoint.objects.filter(enabled=True, workspace__isnull=True).only(
        "id", "event_types"
    )
    for endpoint_id in [e.pk for e in candidates if AUDIT_EVENT in e.event_types]:
        while True:
            with transaction.atomic():
                endpoint = (
                    WebhookEndpoint.objects.select_for_update(skip_locked=True)
                    .filter(pk=endpoint_id, enabled=True)
                    .first()
                )
                if endpoint is None:  # another dispatcher holds it, or it was disabled
                    break
                rows = list(
                    AuditEvent.objects.filter(
                        chain=org_chain(endpoint.organization_id), seq__gt=endpoint.audit_cursor
                    )
                    .order_by("seq")
                    .only("id", "seq", "occurred_at")[:batch]
                )
                if not rows:
                    break
                now = timezone.now()
                WebhookDelivery.objects.bulk_create(
                    [
                        WebhookDelivery(
                            endpoint_id=endpoint.pk,
                            audit_event_id=row.pk,
                            event_type=AUDIT_EVENT,
                            occurred_at=row.occurred_at,
                            message_id=f"msg_audit_{row.pk}",
                            next_attempt_at=now,
                        )
                        for row in rows
                    ],
                    ignore_conflicts=True,
                )
                endpoint.audit_cursor = rows[-1].seq
                endpoint.save(update_fields=["audit_cursor"])
                touched.add(endpoint.pk)
            if len(rows) < batch:
                break
    return touched


def audit_head(organization_id: int) -> int:
    """The organisation's latest audit ``seq``: where a new subscriber starts streaming."""
    last = (
        AuditEvent.objects.filter(chain=org_chain(organization_id))
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return last or 0
