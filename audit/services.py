"""Writing audit events. Services call :func:`record` inside their own transaction, so the event
commits or rolls back with the change it describes."""

from __future__ import annotations

import json
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from .actions import is_registered
from .chain import event_hash, org_chain
from .context import Actor, current_request
from .models import GENESIS_HASH, AuditChainHead, AuditEvent


def _jsonable(value: Any) -> Any:
    # Store exactly what gets hashed: datetimes, decimals and UUIDs become strings up front.
    return json.loads(json.dumps(value, default=str))


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
    if not is_registered(action):
        raise ValueError(f"unregistered audit action {action!r} (add it to audit/actions.py)")
    if workspace is not None and organization is None:
        organization = workspace.organization
    chain = org_chain(getattr(organization, "pk", None))
    ctx = current_request()

    head = AuditChainHead.objects.select_for_update().filter(chain=chain).first()
    if head is None:
        AuditChainHead.objects.bulk_create(
            [AuditChainHead(chain=chain, seq=0, hash=GENESIS_HASH)], ignore_conflicts=True
        )
        head = AuditChainHead.objects.select_for_update().get(chain=chain)

    event = AuditEvent(
        chain=chain,
        seq=head.seq + 1,
        occurred_at=timezone.now(),
        organization=organization,
        workspace=workspace,
        actor_type=actor.kind,
        actor_id=actor.user_id,
        actor_token_id=actor.token_id,
        actor_label=actor.label[:254],
        action=action,
        target_type=target_type or (target._meta.model_name if target is not None else ""),
        target_id=str(target_id if target_id is not None else getattr(target, "pk", "")),
        target_repr=(target_repr or (str(target) if target is not None else ""))[:300],
        changes=_jsonable(changes or {}),
        metadata=_jsonable(metadata or {}),
        request_id=ctx.request_id,
        ip=ctx.ip,
        user_agent=ctx.user_agent,
        prev_hash=head.hash,
    )
    event.hash = event_hash(head.hash, event)
    event.save(force_insert=True)
    AuditChainHead.objects.filter(chain=chain).update(seq=event.seq, hash=event.hash)
    return event
