"""Sending deliveries: claim, sign, POST, record, retry.

A worker claims an endpoint's due deliveries (oldest event first) by writing a lease on them in
one short transaction, sends them one after the other over a kept-alive connection, and records
every outcome in one transaction at the end of the batch. Nothing about a delivery lives only in
a Celery message: a worker killed mid-batch leaves leases that expire, the beat sweep finds the
deliveries due again, and they are sent again with the same ``webhook-id`` (at-least-once). A
lease found expired is logged as an attempt lost with its worker.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import random
import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from audit import services as audit
from audit.context import Actor
from config import secrets as secrets_box

from . import delivery_metrics, emails, signing, ssrf, transport
from .models import (
    DeliveryState,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)

log = logging.getLogger(__name__)

SYSTEM = Actor.system("webhooks")
BATCH = 100
DRAIN_SECONDS = 10.0  # then the task hands the rest to a fresh task, so endpoints take turns


def isoformat(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def message_data(delivery: WebhookDelivery) -> dict[str, Any]:
    """The ``data`` of a delivery's message (see ``notifications/events.py`` for the shapes)."""
    endpoint = delivery.endpoint
    if delivery.event_id is not None:
        event = delivery.event
        return {
            **event.payload,
            "id": str(event.pk),
            "organization": event.organization.slug,
            "workspace": event.workspace.slug if event.workspace_id else None,
        }
    if delivery.audit_event_id is not None:
        row = delivery.audit_event
        return {
            "id": str(row.pk),
            "organization": endpoint.organization.slug,
            "workspace": row.workspace.slug if row.workspace_id else None,
            "seq": row.seq,
            "action": row.action,
            "actor": {"type": row.actor_type, "label": row.actor_label},
            "target": {"type": row.target_type, "id": row.target_id, "repr": row.target_repr},
            "changes": row.changes,
            "metadata": row.metadata,
            "request_id": row.request_id,
            "ip": row.ip,
            "hash": row.hash,
        }
    return delivery.data


def message_body(delivery: WebhookDelivery) -> dict[str, Any]:
    return {
        "type": delivery.event_type,
        "timestamp": isoformat(delivery.occurred_at),
        "data": message_data(delivery),
    }


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def retry_delay(failures: int) -> float | None:
    """Seconds until the next attempt after ``failures`` failed ones, or None once the
    schedule is used up. Jitter spreads the retries of an outage's backlog."""
    schedule = settings.WEBHOOK_RETRY_SCHEDULE
    if failures >= len(schedule):
        return None
    jitter = settings.WEBHOOK_RETRY_JITTER
    return schedule[failures] * random.uniform(1 - jitter, 1 + jitter)


def valid_secrets(endpoint: WebhookEndpoint, now: dt.datetime) -> list[str]:
    rows = endpoint.secrets.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    return [secrets_box.decrypt(row.secret_encrypted) for row in rows]


# --- claiming ----------------------------------------------------------------------------------


def _claim(endpoint_id: int, now: dt.datetime) -> tuple[list[WebhookDelivery], dt.datetime]:
    lease = now + dt.timedelta(seconds=settings.WEBHOOK_LEASE_SECONDS)
    with transaction.atomic():
        rows = list(
            WebhookDelivery.objects.select_for_update(skip_locked=True)
            .filter(endpoint_id=endpoint_id, state=DeliveryState.PENDING, next_attempt_at__lte=now)
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
            .order_by("occurred_at", "id")
            .values_list("id", "lease_until")[:BATCH]
        )
        if not rows:
            return [], lease
        ids = [pk for pk, _ in rows]
        WebhookDelivery.objects.filter(pk__in=ids).update(lease_until=lease)
        lost = {pk: held for pk, held in rows if held is not None}
        if lost:
            _record_lost(lost)
    deliveries = list(
        WebhookDelivery.objects.filter(pk__in=ids)
        .select_related(
            "endpoint__organization",
            "endpoint__workspace",
            "event__organization",
            "event__workspace",
            "audit_event__workspace",
        )
        .order_by("occurred_at", "id")
    )
    return deliveries, lease


def _record_lost(lost: dict[int, dt.datetime]) -> None:
    """A lease that expired means its worker died, possibly mid-request: log that attempt."""
    lease = dt.timedelta(seconds=settings.WEBHOOK_LEASE_SECONDS)
    WebhookAttempt.objects.bulk_create(
        WebhookAttempt(
            delivery_id=pk,
            started_at=held - lease,
            error="the worker sending this attempt was lost before it recorded an outcome",
        )
        for pk, held in lost.items()
    )
    WebhookDelivery.objects.filter(pk__in=list(lost)).update(attempt_count=F("attempt_count") + 1)


# --- sending -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Sent:
    delivery: WebhookDelivery
    started_at: dt.datetime
    outcome: transport.Outcome


def endpoint_deliver(endpoint_id: int) -> dt.datetime | None:
    """Send the due deliveries of one endpoint, oldest event first, for up to DRAIN_SECONDS.

    Returns when the endpoint next has something due (now, if the drain stopped for time),
    or None if nothing is pending.
    """
    deadline = time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        now = timezone.now()
        deliveries, lease = _claim(endpoint_id, now)
        if not deliveries:
            break
        endpoint = deliveries[0].endpoint
        if not endpoint.enabled:
            _release([d.pk for d in deliveries], lease)
            return None
        sent = _send_batch(endpoint, deliveries, lease)
        _record(endpoint, sent, [d.pk for d in deliveries[len(sent) :]], lease)
        if not endpoint.enabled:
            return None
    return next_due(endpoint_id)


def next_due(endpoint_id: int) -> dt.datetime | None:
    row = (
        WebhookDelivery.objects.filter(endpoint_id=endpoint_id, state=DeliveryState.PENDING)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", "lease_until")
        .first()
    )
    if row is None:
        return None
    due, lease = row
    return max(due, lease) if lease else due


def _send_batch(
    endpoint: WebhookEndpoint, deliveries: list[WebhookDelivery], lease: dt.datetime
) -> list[Sent]:
    timeout = settings.WEBHOOK_TIMEOUT_SECONDS
    keys = valid_secrets(endpoint, timezone.now())
    try:
        destination = ssrf.check_url(endpoint.url)  # resolved once for the batch
        refused = ""
    except ssrf.UnsafeURL as exc:
        destination, refused = None, f"refused by the SSRF guard: {exc}"
    sent: list[Sent] = []
    for delivery in deliveries:
        started = timezone.now()
        # Never start a request that could outlive the lease: another worker would resend it.
        if (lease - started).total_seconds() < timeout + 5:
            break
        if destination is None:
            sent.append(Sent(delivery, started, transport.Outcome(None, 0, error=refused[:500])))
            continue
        body = encode(message_body(delivery))
        headers = signing.headers(keys, delivery.message_id, int(time.time()), body)
        outcome = transport.post(destination, body, headers, timeout)
        sent.append(Sent(delivery, started, outcome))
        if outcome.status_code == 410:
            break
    return sent


def _release(ids: list[int], lease: dt.datetime) -> None:
    if ids:
        WebhookDelivery.objects.filter(pk__in=ids, lease_until=lease).update(lease_until=None)


# --- recording ---------------------------------------------------------------------------------


@transaction.atomic
def _record(
    endpoint: WebhookEndpoint, sent: list[Sent], unsent: list[int], lease: dt.datetime
) -> None:
    now = timezone.now()
    WebhookAttempt.objects.bulk_create(
        WebhookAttempt(
            delivery=item.delivery,
            started_at=item.started_at,
            duration_ms=item.outcome.duration_ms,
            status_code=item.outcome.status_code,
            response_excerpt=item.outcome.excerpt[: WebhookAttempt.EXCERPT_BYTES],
            error=item.outcome.error[:500],
        )
        for item in sent
    )
    # One UPDATE per distinct outcome (a batch of successes is one statement). Each is guarded
    # by this batch's lease: if it ran out and another worker claimed a row, that worker owns
    # the row's outcome.
    groups: dict[tuple, list[int]] = {}
    for item in sent:
        changes = tuple(sorted(_outcome_fields(item.delivery, item.outcome, now).items()))
        groups.setdefault(changes, []).append(item.delivery.pk)
    for changes, ids in groups.items():
        WebhookDelivery.objects.filter(pk__in=ids, lease_until=lease).update(
            attempt_count=F("attempt_count") + 1, lease_until=None, **dict(changes)
        )
    _release(unsent, lease)
    _endpoint_health(endpoint, sent, now)
    transaction.on_commit(lambda: delivery_metrics.attempts_sent(endpoint, sent), robust=True)


def _outcome_fields(
    delivery: WebhookDelivery, outcome: transport.Outcome, now: dt.datetime
) -> dict[str, Any]:
    """The row's new state after one attempt."""
    fields: dict[str, Any] = {
        "last_status_code": outcome.status_code,
        "last_error": outcome.error[:500],
    }
    if outcome.ok:
        return {**fields, "state": DeliveryState.SUCCEEDED, "delivered_at": now,
                "next_attempt_at": None}  # fmt: skip
    if outcome.status_code == 410:
        return {**fields, "state": DeliveryState.FAILED, "next_attempt_at": None}
    failures = delivery.round_failures + 1
    fields["round_failures"] = failures
    delay = retry_delay(failures)
    if delay is None:
        return {**fields, "state": DeliveryState.EXHAUSTED, "next_attempt_at": None}
    if outcome.retry_after is not None:
        delay = min(outcome.retry_after, settings.WEBHOOK_RETRY_AFTER_MAX_SECONDS)
    return {**fields, "next_attempt_at": now + dt.timedelta(seconds=delay)}


def _endpoint_health(endpoint: WebhookEndpoint, sent: list[Sent], now: dt.datetime) -> None:
    """Any success clears the failure streak; a 410, or a streak longer than
    ``WEBHOOK_DISABLE_AFTER_SECONDS``, disables the endpoint."""
    if not sent:
        return
    endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    outcomes = [item.outcome for item in sent]
    if any(o.ok for o in outcomes):
        if endpoint.failing_since is not None:
            endpoint.failing_since = None
            endpoint.save(update_fields=["failing_since"])
        return
    if endpoint.failing_since is None:
        endpoint.failing_since = sent[0].started_at
        endpoint.save(update_fields=["failing_since"])
    if any(o.status_code == 410 for o in outcomes):
        endpoint_disable(endpoint, reason="the endpoint answered 410 Gone")
        return
    streak = (now - endpoint.failing_since).total_seconds()
    if streak >= settings.WEBHOOK_DISABLE_AFTER_SECONDS:
        days = settings.WEBHOOK_DISABLE_AFTER_SECONDS / 86400
        endpoint_disable(endpoint, reason=f"every attempt failed for {days:g} days")


def endpoint_disable(endpoint: WebhookEndpoint, *, reason: str) -> None:
    """Disable an endpoint for the system (inside the caller's transaction) and tell the org's
    admins by email once it commits."""
    if not endpoint.enabled:
        return
    endpoint.enabled = False
    endpoint.disabled_reason = reason[:300]
    endpoint.disabled_at = timezone.now()
    endpoint.save(update_fields=["enabled", "disabled_reason", "disabled_at", "updated_at"])
    audit.record(
        actor=SYSTEM,
        action="webhook.disable",
        target=endpoint,
        organization=endpoint.organization,
        workspace=endpoint.workspace,
        changes={"enabled": [True, False]},
        metadata={"reason": reason},
    )
    emails.schedule_endpoint_disabled(endpoint.pk)
    log.warning("webhook %s disabled: %s", endpoint.pk, reason)
