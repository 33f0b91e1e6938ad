"""The hash chain: how an event is hashed, and how a chain is verified.

``hash = sha256(prev_hash + canonical form of the event's fields)``. Each row names its canonical
form in ``hash_version``, so a chain verifies from the database alone, old rows included:

1. ``json.dumps(sort_keys=True)`` of the values as the writer held them, before storage. A value
   the database gives back in another form breaks it: jsonb returns the float ``1e16`` as the
   integer ``10000000000000000``. Rows written before migration 0004 keep it.
2. RFC 8785 (JSON Canonicalization Scheme) of the values exactly as stored: the writer takes them
   through the database first (audit/services.py), and verify reads them back from it. The
   version itself is hashed, so relabelling a row to the other form is caught.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import rfc8785

from .models import GENESIS_HASH, HASH_V1_JSON_DUMPS, HASH_V2_RFC8785, AuditChainHead, AuditEvent

HASHED_FIELDS = (
    "chain", "seq", "occurred_at", "organization_id", "workspace_id", "actor_type", "actor_id",
    "actor_token_id", "actor_label", "action", "target_type", "target_id", "target_repr",
    "changes", "metadata", "request_id", "ip", "user_agent",
)  # fmt: skip

SAFE_INTEGER = 2**53 - 1  # RFC 8785 numbers are IEEE doubles (I-JSON)


def canonical_json(value: Any) -> str:
    """The version 1 form (also the idempotency fingerprint of a request body)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def jcs_input(value: Any) -> Any:
    """A stored JSON value as RFC 8785 input: the same value wherever RFC 8785 can print it.

    Where it cannot, a tagged form, used only inside the hash input:

    - an integer beyond ±(2**53-1) (jsonb keeps any number exactly: the float 1e300 comes back
      as a 301-digit integer) stays a number when RFC 8785 prints it as a double with exactly
      its digits (10000000000000000), and is ``{"$bigint": "<digits>"}`` otherwise;
    - a string that is not valid Unicode (a lone surrogate, which only SQLite's JSON text
      holds) is ``{"$utf16": "<hex of its UTF-16-BE code units>"}``, as a key ``"$utf16:<hex>"``;
    - a stored key that starts with ``$`` gets one more ``$``, so no stored value takes the
      form of a tag.

    Two different stored values therefore never share a hash input, except numbers RFC 8785
    itself holds equal (``2`` and ``2.0``).
    """
    # Ordered by how often each kind occurs: this runs for every event written and verified.
    if isinstance(value, str):
        return value if _is_unicode(value) else {"$utf16": _utf16_hex(value)}
    if isinstance(value, dict):
        return {_jcs_key(key): jcs_input(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jcs_input(item) for item in value]
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        return value if -SAFE_INTEGER <= value <= SAFE_INTEGER else _big_integer(value)
    raise TypeError(f"not a stored JSON value: {type(value).__name__}")


def _big_integer(value: int) -> float | dict[str, str]:
    try:
        as_double = float(value)
    except OverflowError:  # beyond the largest double
        return {"$bigint": str(value)}
    if rfc8785.dumps(as_double) == str(value).encode():
        return as_double
    return {"$bigint": str(value)}


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _utf16_hex(text: str) -> str:
    return text.encode("utf-16-be", "surrogatepass").hex()


def _jcs_key(key: str) -> str:
    if not _is_unicode(key):
        return f"$utf16:{_utf16_hex(key)}"
    return f"${key}" if key.startswith("$") else key


def event_payload(event: AuditEvent) -> dict[str, Any]:
    payload = {name: getattr(event, name) for name in HASHED_FIELDS}
    payload["occurred_at"] = event.occurred_at.isoformat(timespec="microseconds")
    return payload


def event_hash(prev_hash: str, event: AuditEvent) -> str:
    """The event's hash in its own ``hash_version``; ValueError for a version this code lacks."""
    payload = event_payload(event)
    if event.hash_version == HASH_V2_RFC8785:
        payload["hash_version"] = HASH_V2_RFC8785
        data = prev_hash.encode() + rfc8785.dumps(jcs_input(payload))
    elif event.hash_version == HASH_V1_JSON_DUMPS:
        data = (prev_hash + canonical_json(payload)).encode()
    else:
        raise ValueError(f"unknown hash version {event.hash_version}")
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass
class VerifyResult:
    chain: str
    checked: int
    ok: bool
    first_broken: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def verify_chain(chain: str) -> VerifyResult:
    """Recompute a chain from its first event, each in its own hash version; name the first
    link that does not hold."""
    prev_hash, expected_seq, checked = GENESIS_HASH, 1, 0
    events = AuditEvent.objects.filter(chain=chain).order_by("seq")
    for event in events.iterator(chunk_size=2000):
        problem = None
        if event.seq != expected_seq:
            problem = f"sequence gap: expected seq {expected_seq}, found {event.seq}"
        elif event.prev_hash != prev_hash:
            problem = "prev_hash does not match the previous event's hash"
        else:
            try:
                if event_hash(prev_hash, event) != event.hash:
                    problem = "stored hash does not match the event's content"
            except ValueError as exc:  # an unknown version, or content no version can hash
                problem = f"cannot recompute the hash: {exc}"
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
