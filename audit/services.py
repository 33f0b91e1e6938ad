"""Writing audit events. Services call :func:`record` inside their own transaction, so the event
commits or rolls back with the change it describes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.db import connection, models, transaction
from django.utils import timezone

from config.db import copy_insert
from config.errors import clean_or_raise

from .actions import is_registered
from .chain import event_hash, org_chain
from .context import Actor, current_request
from .models import GENESIS_HASH, HASH_VERSION, AuditChainHead, AuditEvent


def _as_stored(values: list[Any]) -> list[Any]:
    """The JSON values as the database gives them back once stored, which is what gets hashed.

    Datetimes, decimals and UUIDs become strings first, as they always have (``default=str``);
    NaN and infinities, which no JSON column stores, are refused here. On PostgreSQL the batch
    takes one round-trip through jsonb, which keeps numbers as ``numeric`` and prints them its
    own way (the float ``1e16`` comes back as the integer ``10000000000000000``, ``-0.0`` as
    ``0.0``); other databases store the JSON text itself.
    """
    text = json.dumps(values, default=str, allow_nan=False)
    if connection.vendor != "postgresql":
        return json.loads(text)
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb", [text])
        stored = cursor.fetchone()[0]
    # Django reads jsonb as text and decodes it in JSONField, as this does.
    return json.loads(stored) if isinstance(stored, str) else stored


def diff(instance: models.Model, before: dict[str, Any], fields: list[str]) -> dict[str, list]:
    """``{"field": [old, new]}`` for the fields whose value changed since ``before``."""
    out = {}
    for name in fields:
        new = getattr(instance, name)
        if before.get(name) != new:
            out[name] = [before.get(name), new]
    return out


def snapshot(instance: models.Model, fields: list[str]) -> dict[str, Any]:
    return {name: getattr(instance, name) for name in fields}


def model_update(
    *,
    instance: models.Model,
    fields: list[str],
    data: dict[str, Any],
    actor: Actor,
    action: str,
    validate: Callable[[dict[str, list]], None] | None = None,
    full_clean: bool = True,
    also: dict[str, Any] | None = None,
    target_repr: str | None = None,
    **scope: Any,
) -> dict[str, list]:
    """Set on ``instance`` the ``fields`` that ``data`` holds (nothing else) and return what
    changed, ``{"field": [old, new]}``. When something did, save the changed fields (and the
    model's ``auto_now`` ones) and record ``action`` with the changes in the same transaction;
    when nothing did, save and record nothing.

    Before saving: ``validate(changes)`` checks rules that need other rows (it runs even when
    nothing changed); then, with ``full_clean``, the model's own validation, a failure raised as
    an ``InvalidInput`` naming the field. ``also`` holds values that go with a change without
    being part of it (bookkeeping), set and saved only when something changed. ``scope`` is the
    ``organization``/``workspace`` of :func:`record`.
    """
    before = snapshot(instance, fields)
    for name in fields:
        if name in data:
            setattr(instance, name, data[name])
    changes = diff(instance, before, fields)
    if validate is not None:
        validate(changes)
    if not changes:
        return changes
    for name, value in (also or {}).items():
        setattr(instance, name, value)
    if full_clean:
        clean_or_raise(instance)
    stamped = [f.name for f in instance._meta.concrete_fields if getattr(f, "auto_now", False)]
    instance.save(update_fields=[*changes, *(also or {}), *stamped])
    record(
        actor=actor,
        action=action,
        target=instance,
        target_repr=target_repr,
        changes=changes,
        **scope,
    )
    return changes


# No savepoint: an audit write that fails must fail the whole change it describes.
@transaction.atomic(savepoint=False)
def record(
    *,
    actor: Actor,
    action: str,
    target: models.Model | None = None,
    target_type: str | None = None,
    target_id: str | int | None = None,
    target_repr: str | None = None,
    organization: Any = None,
    workspace: Any = None,
    changes: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event to its organisation's chain."""
    entry = {
        "action": action,
        "target": target,
        "target_type": target_type,
        "target_id": target_id,
        "target_repr": target_repr,
        "workspace": workspace,
        "changes": changes,
        "metadata": metadata,
    }
    return record_many(actor=actor, organization=organization, entries=[entry])[0]


@transaction.atomic(savepoint=False)
def record_many(
    *, actor: Actor, organization: Any, entries: list[dict[str, Any]]
) -> list[AuditEvent]:
    """Append events to one organisation's chain with one lock, one insert and one head update
    (the admission of many jobs at once). Each entry takes the keyword arguments of
    :func:`record` but ``actor`` and ``organization``."""
    for entry in entries:
        if not is_registered(entry["action"]):
            raise ValueError(
                f"unregistered audit action {entry['action']!r} (add it to audit/actions.py)"
            )
    if organization is None and entries and entries[0].get("workspace") is not None:
        organization = entries[0]["workspace"].organization
    chain = org_chain(getattr(organization, "pk", None))
    ctx = current_request()

    head = AuditChainHead.objects.select_for_update().filter(chain=chain).first()
    if head is None:
        AuditChainHead.objects.bulk_create(
            [AuditChainHead(chain=chain, seq=0, hash=GENESIS_HASH)], ignore_conflicts=True
        )
        head = AuditChainHead.objects.select_for_update().get(chain=chain)

    events, seq, prev_hash, now = [], head.seq, head.hash, timezone.now()
    # Hash what the database will hand back to verify: the JSON columns as stored, the address
    # as the inet column prints it.
    stored_json = _as_stored([[e.get("changes") or {}, e.get("metadata") or {}] for e in entries])
    ip = AuditEvent._meta.get_field("ip").get_prep_value(ctx.ip)
    for entry, (changes, metadata) in zip(entries, stored_json, strict=True):
        target = entry.get("target")
        target_id = entry.get("target_id")
        seq += 1
        event = AuditEvent(
            chain=chain,
            seq=seq,
            occurred_at=now,
            organization=organization,
            workspace=entry.get("workspace"),
            actor_type=actor.kind,
            actor_id=actor.user_id,
            actor_token_id=actor.token_id,
            actor_label=actor.label[:254],
            action=entry["action"],
            target_type=entry.get("target_type")
            or (target._meta.model_name if target is not None else ""),
            target_id=str(target_id if target_id is not None else getattr(target, "pk", "")),
            target_repr=(entry.get("target_repr") or (str(target) if target is not None else ""))[
                :300
            ],
            changes=changes,
            metadata=metadata,
            request_id=ctx.request_id,
            ip=ip,
            user_agent=ctx.user_agent,
            prev_hash=prev_hash,
            hash_version=HASH_VERSION,
        )
        event.hash = prev_hash = event_hash(prev_hash, event)
        events.append(event)
    copy_insert(AuditEvent, events)
    AuditChainHead.objects.filter(chain=chain).update(seq=seq, hash=prev_hash)
    return events
