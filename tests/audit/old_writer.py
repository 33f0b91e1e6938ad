"""Appending an event the way Manta did before hash versions (migration 0004): the hash over
``json.dumps(sort_keys=True)`` of the values as the writer held them. Written out here, not taken
from audit/chain.py, so the tests prove that old rows still verify rather than that the code
agrees with itself."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.utils import timezone

V1_FIELDS = (
    "chain", "seq", "occurred_at", "organization_id", "workspace_id", "actor_type", "actor_id",
    "actor_token_id", "actor_label", "action", "target_type", "target_id", "target_repr",
    "changes", "metadata", "request_id", "ip", "user_agent",
)  # fmt: skip


def v1_hash(prev_hash: str, event: Any) -> str:
    payload = {name: getattr(event, name) for name in V1_FIELDS}
    payload["occurred_at"] = event.occurred_at.isoformat(timespec="microseconds")
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)  # fmt: skip
    return hashlib.sha256((prev_hash + text).encode()).hexdigest()


def append_v1_event(
    event_model: Any, head_model: Any, *, chain: str, changes: dict, **fields: Any
) -> Any:
    """Append one event to ``chain`` with the old hash. The models are parameters so a migration
    test can pass the historical ones (before the column existed); ``fields`` may set
    ``hash_version=1`` where the column exists."""
    head, _ = head_model.objects.get_or_create(chain=chain, defaults={"seq": 0, "hash": "0" * 64})
    event = event_model(
        chain=chain, seq=head.seq + 1, occurred_at=timezone.now(), actor_type="system",
        actor_label="system:old-writer", action="org.update", target_type="organization",
        target_id="1", target_repr="Old", changes=json.loads(json.dumps(changes, default=str)),
        metadata={}, request_id="", ip=None, user_agent="", prev_hash=head.hash, **fields,
    )  # fmt: skip
    event.hash = v1_hash(head.hash, event)
    event.save()
    head_model.objects.filter(chain=chain).update(seq=event.seq, hash=event.hash)
    return event
