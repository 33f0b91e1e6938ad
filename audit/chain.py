"""The hash chain: how an event is hashed, and how a chain is verified."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from .models import GENESIS_HASH, AuditChainHead, AuditEvent

HASHED_FIELDS = (
    "chain", "seq", "occurred_at", "organization_id", "workspace_id", "actor_type", "actor_id",
    "actor_token_id", "actor_label", "action", "target_type", "target_id", "target_repr",
    "changes", "metadata", "request_id", "ip", "user_agent",
)  # fmt: skip


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def event_payload(event: AuditEvent) -> dict[str, Any]:
    payload = {name: getattr(event, name) for name in HASHED_FIELDS}
    payload["occurred_at"] = event.occurred_at.isoformat(timespec="microseconds")
    return payload


def event_hash(prev_hash: str, event: AuditEvent) -> str:
    data = prev_hash + canonical_json(event_payload(event))
    return hashlib.sha256(data.encode()).hexdigest()


@dataclasses.dataclass
class VerifyResult:
    chain: str
    checked: int
    ok: bool
    first_broken: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def verify_chain(chain: str) -> VerifyResult:
    """Recompute a chain from its first event; name the first link that does not hold."""
    prev_hash, expected_seq, checked = GENESIS_HASH, 1, 0
    events = AuditEvent.objects.filter(chain=chain).order_by("seq")
    for event in events.iterator(chunk_size=2000):
        problem = None
        if event.seq != expected_seq:
            problem = f"sequence gap: expected seq {expected_seq}, found {event.seq}"
        elif event.prev_hash != prev_hash:
            problem = "prev_hash does not match the previous event's hash"
        elif event_hash(prev_hash, event) != event.hash:
            problem = "stored hash does not match the event's content"
        if problem:
            broken = {"id": event.pk, "seq": event.seq, "action": event.action, "reason": problem}
            return VerifyResult(chain=chain, checked=checked, ok=False, first_broken=broken)
        prev_hash, expected_seq, checked = event.hash, expected_seq + 1, checked + 1

    head = AuditChainHead.objects.filter(chain=chain).first()
    if head is not None and (head.seq, head.hash) != (checked, prev_hash):
        broken = {
            "id": None,
            "seq": checked + 1,
            "action": None,
            "reason": f"chain head is at seq {head.seq} but only {checked} events follow the chain",
        }
        return VerifyResult(chain=chain, checked=checked, ok=False, first_broken=broken)
    return VerifyResult(chain=chain, checked=checked, ok=True)


def org_chain(organization_id: int | None) -> str:
    return f"org:{organization_id}" if organization_id else "global"
