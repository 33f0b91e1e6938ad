"""Every write of webhook endpoints and deliveries: validate, change rows, record the audit
event and schedule delivery work on commit. (Domain events are written by ``outbox.services``.)
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit import services as audit
from audit.context import Actor
from config import secrets as secrets_box
from config.errors import Conflict, InvalidInput
from workspaces.archive import require_active
from workspaces.models import Organization, Workspace

from . import signing, ssrf
from .dispatch import audit_head
from .events import AUDIT_EVENT, ORG_ONLY, PING, SUBSCRIBABLE
from .models import (
    DeliveryState,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookSecret,
)
from .tasks import deliver

MAX_GRACE_SECONDS = 7 * 86400


# --- endpoints ---------------------------------------------------------------------------------


def _clean_event_types(event_types: list[str], *, org_level: bool) -> list[str]:
    types = list(dict.fromkeys(event_types))  # de-duplicated, order kept
    if not types:
        raise InvalidInput.on("event_types", 'name at least one event type, or ["*"] for all')
    if WebhookEndpoint.ALL in types and len(types) > 1 and set(types) - {"*", AUDIT_EVENT}:
        raise InvalidInput.on("event_types", '"*" already means every type but audit.event')
    unknown = [t for t in types if t != WebhookEndpoint.ALL and t not in SUBSCRIBABLE]
    if unknown:
        raise InvalidInput.on("event_types", f"unknown event type {unknown[0]!r}")
    if not org_level and ORG_ONLY & set(types):
        raise InvalidInput.on(
            "event_types", "audit.event can only be chosen on an organisation-level endpoint"
        )
    return types


def _check_url(url: str) -> None:
    try:
        ssrf.check_url(url)
    except ssrf.UnsafeURL as exc:
        raise InvalidInput.on("url", str(exc)) from exc


def _secret_add(endpoint: WebhookEndpoint) -> str:
    secret = signing.secret_generate()
    WebhookSecret.objects.create(endpoint=endpoint, secret_encrypted=secrets_box.encrypt(secret))
    return secret


@transaction.atomic
def webhook_create(
    *,
    actor: Actor,
    organization: Organization,
    workspace: Workspace | None,
    url: str,
    event_types: list[str],
    description: str = "",
    enabled: bool = True,
) -> tuple[WebhookEndpoint, str]:
    """Create an endpoint; returns it and its signing secret (which is never shown again)."""
    if workspace is not None:
        require_active(workspace)
    types = _clean_event_types(event_types, org_level=workspace is None)
    _check_url(url)
    endpoint = WebhookEndpoint.objects.create(
        organization=organization,
        workspace=workspace,
        url=url,
        description=description,
        event_types=types,
        enabled=enabled,
        created_by=actor.user,
    )
    secret = _secret_add(endpoint)
    created = audit.record(
        actor=actor,
        action="webhook.create",
        target=endpoint,
        organization=organization,
        workspace=workspace,
        changes={"url": [None, url], "event_types": [None, types], "enabled": [None, enabled]},
    )
    if AUDIT_EVENT in types:  # stream from after this endpoint's creation, not the org's history
        endpoint.audit_cursor = created.seq
        endpoint.save(update_fields=["audit_cursor"])
    return endpoint, secret


ENDPOINT_EDITABLE = ["url", "description", "event_types", "enabled"]


@transaction.atomic
def webhook_update(
    *, actor: Actor, endpoint: WebhookEndpoint, data: dict[str, Any]
) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    if "event_types" in data:
        data["event_types"] = _clean_event_types(
            data["event_types"], org_level=endpoint.workspace_id is None
        )
    if "url" in data and data["url"] != endpoint.url:
        _check_url(data["url"])
    reenabled = data.get("enabled") is True and endpoint.enabled is False
    bookkeeping: dict[str, Any] = {}
    if reenabled:  # a fresh start
        bookkeeping.update(disabled_reason="", disabled_at=None, failing_since=None)
    if AUDIT_EVENT in data.get("event_types", []) and AUDIT_EVENT not in endpoint.event_types:
        bookkeeping["audit_cursor"] = audit_head(endpoint.organization_id)  # stream from now on
    audit.model_update(
        instance=endpoint,
        fields=ENDPOINT_EDITABLE,
        data=data,
        actor=actor,
        action="webhook.update",
        full_clean=False,
        also=bookkeeping,
        organization=endpoint.organization,
        workspace=endpoint.workspace,
    )
    if reenabled:
        _deliver_on_commit(endpoint.pk)  # what waited while it was disabled
    return endpoint


@transaction.atomic
def webhook_delete(*, actor: Actor, endpoint: WebhookEndpoint) -> None:
    audit.record(
        actor=actor,
        action="webhook.delete",
        target=endpoint,
        organization=endpoint.organization,
        workspace=endpoint.workspace,
        changes={"url": [endpoint.url, None]},
    )
    endpoint.delete()


@transaction.atomic
def webhook_rotate_secret(
    *, actor: Actor, endpoint: WebhookEndpoint, grace_period_seconds: int | None = None
) -> tuple[str, dt.datetime]:
    """Add a new secret; the current ones stay valid for the grace period, during which every
    message carries a signature for each. Returns the new secret and when the old ones expire."""
    grace = (
        settings.WEBHOOK_ROTATION_GRACE_SECONDS
        if grace_period_seconds is None
        else grace_period_seconds
    )
    if not 0 <= grace <= MAX_GRACE_SECONDS:
        raise InvalidInput.on("grace_period_seconds", f"must be between 0 and {MAX_GRACE_SECONDS}")
    endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    now = timezone.now()
    expires = now + dt.timedelta(seconds=grace)
    endpoint.secrets.filter(expires_at__lte=now).delete()
    endpoint.secrets.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=expires)).update(
        expires_at=expires
    )
    secret = _secret_add(endpoint)
    audit.record(
        actor=actor,
        action="webhook.rotate_secret",
        target=endpoint,
        organization=endpoint.organization,
        workspace=endpoint.workspace,
        metadata={"grace_period_seconds": grace, "previous_secrets_expire_at": expires},
    )
    return secret, expires


def _require_enabled(endpoint: WebhookEndpoint) -> None:
    if not endpoint.enabled:
        raise Conflict(
            "the endpoint is disabled; enable it first",
            errors={"enabled": [endpoint.disabled_reason or "disabled"]},
        )


@transaction.atomic
def webhook_ping(*, actor: Actor, endpoint: WebhookEndpoint) -> WebhookDelivery:
    """Queue a ``webhook.ping`` message to the endpoint."""
    _require_enabled(endpoint)
    now, event_id = timezone.now(), uuid.uuid4()
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint,
        event_type=PING,
        occurred_at=now,
        message_id=f"msg_{event_id.hex}",
        next_attempt_at=now,
        data={
            "id": str(event_id),
            "organization": endpoint.organization.slug,
            "workspace": endpoint.workspace.slug if endpoint.workspace_id else None,
            "webhook": endpoint.pk,
            "message": f"ping from {actor.label}",
        },
    )
    audit.record(
        actor=actor,
        action="webhook.ping",
        target=endpoint,
        organization=endpoint.organization,
        workspace=endpoint.workspace,
        metadata={"message_id": delivery.message_id},
    )
    _deliver_on_commit(endpoint.pk)
    return delivery


@transaction.atomic
def delivery_redeliver(*, actor: Actor, delivery: WebhookDelivery) -> WebhookDelivery:
    """Send a delivery again, now, with a fresh retry schedule and the same ``webhook-id``."""
    delivery = (
        WebhookDelivery.objects.select_for_update(of=("self",))
        .select_related("endpoint__organization", "endpoint__workspace")
        .get(pk=delivery.pk)
    )
    endpoint = delivery.endpoint
    _require_enabled(endpoint)
    before = delivery.state
    delivery.state = DeliveryState.PENDING
    delivery.round_failures = 0
    delivery.next_attempt_at = timezone.now()
    delivery.save(update_fields=["state", "round_failures", "next_attempt_at"])
    audit.record(
        actor=actor,
        action="webhook.redeliver",
        target=endpoint,
        organization=endpoint.organization,
        workspace=endpoint.workspace,
        changes={"state": [before, DeliveryState.PENDING]},
        metadata={"delivery": delivery.pk, "message_id": delivery.message_id},
    )
    _deliver_on_commit(endpoint.pk)
    return delivery


def _deliver_on_commit(endpoint_id: int) -> None:
    transaction.on_commit(lambda: deliver.delay(endpoint_id), robust=True)
