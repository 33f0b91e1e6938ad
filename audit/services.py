"""Writing audit events. Services call :func:`record` inside their own transaction, so the event
commits or rolls back with the change it describes."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, connection, models, transaction
from django.db.models import F, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from config.db import defer
from config.errors import clean_or_raise

from .actions import is_registered
from .chain import (
    VerifyResult,
    canonical_v2,
    event_payload,
    org_chain,
    stored_json,
    verify_chain,
)
from .context import Actor, current_request
from .models import GENESIS_HASH, HASH_VERSION, AuditChainHead, AuditCheckpoint, AuditEvent
from .signing import checkpoint_signature

log = logging.getLogger(__name__)


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
    """Append one event to its organisation's chain: in the caller's transaction, so it commits
    or rolls back with the change it describes (no savepoint: an audit write that fails fails
    that whole change)."""
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


def record_many(
    *, actor: Actor, organization: Any, entries: list[dict[str, Any]]
) -> list[AuditEvent]:
    """Append events to one organisation's chain under one lock (the admission of many jobs at
    once). Each entry takes the keyword arguments of :func:`record` but ``actor`` and
    ``organization``.

    Everything an event's hash covers but its place in the chain is known before the chain is
    read, so this canonicalises each event here with its ``seq`` left out, and on PostgreSQL
    one call to ``audit_append`` (migration 0005) locks the head, chains the hashes, inserts the
    events and moves the head: one statement, however many events. Called outside a
    transaction, that statement is its own (no BEGIN and COMMIT round trips around it).
    """
    for entry in entries:
        if not is_registered(entry["action"]):
            raise ValueError(
                f"unregistered audit action {entry['action']!r} (add it to audit/actions.py)"
            )
    if organization is None and entries and entries[0].get("workspace") is not None:
        organization = entries[0]["workspace"].organization
    chain = org_chain(getattr(organization, "pk", None))
    ctx = current_request()
    now = timezone.now()
    # Hash what the database will hand back to verify: the JSON columns as stored, the address
    # as the inet column prints it.
    numeric = connection.vendor == "postgresql"
    stored = [
        stored_json([e.get("changes") or {}, e.get("metadata") or {}], numeric=numeric)
        for e in entries
    ]
    ip = AuditEvent._meta.get_field("ip").get_prep_value(ctx.ip)
    events, parts = [], []
    for entry, ((changes, metadata), plain_numbers) in zip(entries, stored, strict=True):
        target = entry.get("target")
        target_id = entry.get("target_id")
        event = AuditEvent(
            chain=chain,
            seq=0,  # placed by the append
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
            hash_version=HASH_VERSION,
        )
        values = [*event_payload(event).values(), HASH_VERSION]
        parts.append(_around_seq(canonical_v2(values, plain_numbers=plain_numbers)))
        events.append(event)
    if connection.vendor == "postgresql":
        _append_in_database(chain, events, parts)
    else:
        _append_here(chain, events, parts)
    return events


_SEQ_PLACEHOLDER = b',"seq":0,'


def _around_seq(canonical: bytes) -> tuple[bytes, bytes]:
    """The canonical bytes before and after the digits of ``seq`` (written as 0), which RFC 8785
    prints as digits up to 2**53 - 1. The last match is the top-level key: the keys after it
    hold only strings and numbers, and in a string every ``"`` is escaped."""
    at = canonical.rindex(_SEQ_PLACEHOLDER) + len(_SEQ_PLACEHOLDER) - 2
    return canonical[:at], canonical[at + 1 :]


# The columns the append writes besides chain, seq and the hashes, as audit_append reads them.
_ROW_FIELDS = (
    "occurred_at", "organization_id", "workspace_id", "actor_type", "actor_id", "actor_token_id",
    "actor_label", "action", "target_type", "target_id", "target_repr", "changes", "metadata",
    "request_id", "ip", "user_agent", "hash_version",
)  # fmt: skip


def _append_in_database(
    chain: str, events: list[AuditEvent], parts: list[tuple[bytes, bytes]]
) -> None:
    rows = [{name: getattr(event, name) for name in _ROW_FIELDS} for event in events]
    for row in rows:
        row["occurred_at"] = row["occurred_at"].isoformat()
    sql = "SELECT * FROM audit_append(%s, %s::jsonb, %s::bytea[], %s::bytea[])"
    params = [chain, json.dumps(rows), [b for b, _ in parts], [a for _, a in parts]]

    def learn(placed: list) -> None:
        placed = sorted(placed, key=lambda row: row[1])
        for event, (pk, seq, prev_hash, hash_) in zip(events, placed, strict=True):
            event.pk, event.seq, event.prev_hash, event.hash = pk, seq, prev_hash, hash_

    # In a one_statement block (a job's submission) the append goes with the block's inserts.
    placed = "json_agg(json_build_array(new_id, new_seq, new_prev_hash, new_hash))"
    if not defer(sql, params, placed, learn):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            learn(cursor.fetchall())
    for event in events:
        event._state.adding, event._state.db = False, connection.alias


@transaction.atomic(savepoint=False)
def _append_here(chain: str, events: list[AuditEvent], parts: list[tuple[bytes, bytes]]) -> None:
    """The same append in Python, for databases without audit_append (SQLite)."""
    head = AuditChainHead.objects.select_for_update().filter(chain=chain).first()
    if head is None:
        AuditChainHead.objects.bulk_create(
            [AuditChainHead(chain=chain, seq=0, hash=GENESIS_HASH)], ignore_conflicts=True
        )
        head = AuditChainHead.objects.select_for_update().get(chain=chain)
    seq, prev_hash = head.seq, head.hash
    for event, (before, after) in zip(events, parts, strict=True):
        seq += 1
        event.seq, event.prev_hash = seq, prev_hash
        data = prev_hash.encode() + before + str(seq).encode() + after
        event.hash = prev_hash = hashlib.sha256(data).hexdigest()
    AuditEvent.objects.bulk_create(events)
    AuditChainHead.objects.filter(chain=chain).update(seq=seq, hash=prev_hash)


class AuditChainBroken(Exception):
    def __init__(self, result: VerifyResult) -> None:
        self.result = result
        link = result.first_broken or {}
        super().__init__(f"{result.chain}: broken at seq {link.get('seq')}: {link.get('reason')}")


def checkpoint_create(*, chain: str) -> AuditCheckpoint | None:
    """Verify ``chain`` from its latest checkpoint to its head and sign the head; None when the
    chain is empty or its head has not moved since that checkpoint. A chain that does not
    verify gets no checkpoint: AuditChainBroken."""
    result = verify_chain(chain, since_checkpoint=True)
    if not result.ok:
        raise AuditChainBroken(result)
    if result.count == 0 or result.count == result.since_seq:
        return None
    checkpoint = AuditCheckpoint(
        chain=chain,
        count=result.count,
        last_event_id=result.last_event_id,
        head_hash=result.head_hash,
        created_at=timezone.now(),
    )
    checkpoint.signature = checkpoint_signature(checkpoint)
    try:
        with transaction.atomic():
            checkpoint.save(force_insert=True)
    except IntegrityError:  # another run signed the same head first
        return None
    return checkpoint


def checkpoint_chains() -> tuple[list[AuditCheckpoint], list[VerifyResult]]:
    """Checkpoint every chain whose head has moved since its latest checkpoint (the periodic
    task): the checkpoints written, and the chains that did not verify (logged, unsigned)."""
    signed = (
        AuditCheckpoint.objects.filter(chain=OuterRef("chain")).order_by("-count").values("count")
    )
    moved = (
        AuditChainHead.objects.annotate(signed=Coalesce(Subquery(signed[:1]), 0))
        .filter(seq__gt=F("signed"))
        .order_by("chain")
        .values_list("chain", flat=True)
    )
    written, broken = [], []
    for chain in moved:
        try:
            checkpoint = checkpoint_create(chain=chain)
        except AuditChainBroken as exc:
            log.error("audit chain not checkpointed: %s", exc)
            broken.append(exc.result)
            continue
        if checkpoint is not None:
            written.append(checkpoint)
    return written, broken
