"""The hash chain: how an event is hashed, and how a chain is verified.

``hash = sha256(prev_hash + canonical form of the event's fields)``. Each row names its canonical
form in ``hash_version``, so a chain verifies from the database alone, old rows included:

1. ``json.dumps(sort_keys=True)`` of the values as the writer held them, before storage. A value
   the database gives back in another form breaks it: jsonb returns the float ``1e16`` as the
   integer ``10000000000000000``. Rows written before migration 0004 keep it.
2. RFC 8785 (JSON Canonicalization Scheme) of the values exactly as stored: the writer predicts
   what the database will give back (:func:`stored_json`), and verify reads them back from it.
   The version itself is hashed, so relabelling a row to the other form is caught.

Both the writer and verify take a fast road to form 2 where it provably gives the same bytes
(:func:`canonical_v2`), and the ``rfc8785`` package everywhere else.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from decimal import Decimal
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


# --- the fast road to version 2 -----------------------------------------------------------------

# Where Python's own compact, sorted ``json.dumps`` prints a value exactly as RFC 8785 does: no
# float (RFC 8785 prints them the ECMAScript way), no integer of 16 digits or more (beyond 2**53
# they take a tag), no key that starts with ``$`` (it takes one more), and no character from
# U+D800 up (lone surrogates take a tag, and from there UTF-16 orders keys unlike code points).
# Strings are escaped alike: only ``"``, ``\`` and the controls, in the same spellings. Each
# test is conservative (a string of 16 digits takes the slow road too); the slow road is exact.
_LONG_NUMBER = re.compile(r"\d{16}")


def _plain(text: str) -> bool:
    return (
        '"$' not in text
        and (text.isascii() or max(text) < "\ud800")
        and _LONG_NUMBER.search(text) is None
    )


def canonical_v2(payload: dict[str, Any], *, has_float: bool) -> bytes:
    """RFC 8785 of ``jcs_input(payload)``: the bytes version 2 hashes after ``prev_hash``.
    ``has_float`` says whether a float may hide in the payload's JSON values."""
    if not has_float:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        if _plain(text):
            return text.encode()
    return rfc8785.dumps(jcs_input(payload))


def _numeric(text: str) -> int | float:
    """A JSON number as PostgreSQL's jsonb gives it back: ``numeric`` prints no exponent, so a
    number whose exponent leaves no fractional digit comes back an integer (``1e+16`` →
    ``10000000000000000``), and it has no negative zero."""
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and len(mantissa.partition(".")[2]) <= int(exponent):
        return int(Decimal(text))
    return float(text) or 0.0


class JSONReader:
    """Decodes stored JSON text and remembers whether any number in it was not an integer
    literal, which is what :func:`canonical_v2` needs to know. ``numeric=True`` decodes as
    PostgreSQL's jsonb would store the text (the writer's prediction); ``False`` as Django reads
    stored text back (``json.loads``)."""

    def __init__(self, *, numeric: bool = False) -> None:
        self.saw_float = False
        convert: Callable[[str], Any] = _numeric if numeric else float

        def parse_float(text: str) -> Any:
            self.saw_float = True
            return convert(text)

        self._decode = json.JSONDecoder(parse_float=parse_float).decode

    def read(self, text: str) -> Any:
        return {} if text == "{}" else self._decode(text)


def stored_json(values: Any, *, numeric: bool) -> tuple[Any, bool]:
    """``values`` as the database will give them back once stored, and whether they may hold a
    float. Datetimes, decimals and UUIDs become strings first, as they always have
    (``default=str``); NaN and infinities, which no JSON column stores, are refused here. On
    PostgreSQL (``numeric``) the numbers take jsonb's form (:func:`_numeric`); other databases
    store the JSON text itself."""
    text = json.dumps(values, default=str, allow_nan=False, ensure_ascii=False)
    reader = JSONReader(numeric=numeric)
    return reader.read(text), reader.saw_float


def occurred_text(occurred_at: datetime.datetime) -> str:
    return occurred_at.isoformat(timespec="microseconds")


def event_payload(event: AuditEvent) -> dict[str, Any]:
    payload = {name: getattr(event, name) for name in HASHED_FIELDS}
    payload["occurred_at"] = occurred_text(event.occurred_at)
    return payload


def event_hash(prev_hash: str, event: AuditEvent) -> str:
    """The event's hash in its own ``hash_version``; ValueError for a version this code lacks."""
    payload = event_payload(event)
    if event.hash_version == HASH_V2_RFC8785:
        payload["hash_version"] = HASH_V2_RFC8785
        data = prev_hash.encode() + canonical_v2(payload, has_float=True)
    elif event.hash_version == HASH_V1_JSON_DUMPS:
        data = (prev_hash + canonical_json(payload)).encode()
    else:
        raise ValueError(f"unknown hash version {event.hash_version}")
    return hashlib.sha256(data).hexdigest()


# --- verify -------------------------------------------------------------------------------------

# What verify reads of each event: the hashed fields in their stored form (jsonb as its text,
# inet as its text), then the links.
_COLUMNS = (
    "id", "seq", "occurred_at", "organization_id", "workspace_id", "actor_type", "actor_id",
    "actor_token_id", "actor_label", "action", "target_type", "target_id", "target_repr",
    "changes", "metadata", "request_id", "ip", "user_agent", "prev_hash", "hash", "hash_version",
)  # fmt: skip
CHUNK_SIZE = 5000
MAX_PASSES = 10  # after as many, events still being appended are left for the next run


@dataclasses.dataclass
class VerifyResult:
    chain: str
    checked: int
    ok: bool
    first_broken: dict[str, Any] | None = None
    # Where the chain stands: its length, last event and hash (what a checkpoint signs).
    count: int = 0
    last_event_id: int | None = None
    head_hash: str = GENESIS_HASH
    since_seq: int = 0  # verified from this checkpoint on (0: from the first event)
    checkpoints: int = 0  # signed checkpoints found to match the chain

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _stream(chain: str, from_seq: int) -> Iterable[tuple]:
    """The chain's events from ``from_seq`` on, in order, as tuples of :data:`_COLUMNS`, read
    through a server-side cursor (on PostgreSQL) so memory stays flat whatever the length."""
    from django.db import connection
    from django.utils.dateparse import parse_datetime

    quote = connection.ops.quote_name
    sql = (
        f"SELECT {', '.join(quote(c) for c in _COLUMNS)} FROM {quote(AuditEvent._meta.db_table)}"
        " WHERE chain = %s AND seq >= %s ORDER BY seq"
    )
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [chain, from_seq])
        while rows := cursor.fetchmany(CHUNK_SIZE):
            if rows and isinstance(rows[0][2], str):  # SQLite hands datetimes back as text
                rows = [
                    (r[0], r[1], parse_datetime(r[2]).replace(tzinfo=datetime.UTC), *r[3:])
                    for r in rows
                ]
            yield from rows


def verify_chain(chain: str, *, since_checkpoint: bool = False) -> VerifyResult:
    """Recompute a chain, each event in its own hash version, and check it against its head and
    its signed checkpoints; name the first link that does not hold.

    With ``since_checkpoint`` it starts from the chain's latest checkpoint instead: checks its
    signature and that the event it names still has the hash it signed, then recomputes only
    the events after it.
    """
    from .signing import checkpoints_of

    checkpoints, forged = checkpoints_of(chain)
    result = VerifyResult(chain=chain, checked=0, ok=True)
    if forged is not None:
        return _broken(result, None, forged.count, None, "checkpoint signature does not hold")
    start = 1
    if since_checkpoint and checkpoints:
        start = result.since_seq = max(checkpoints)
    prev_hash, expected_seq = GENESIS_HASH, start
    head: tuple[int, str] | None = None
    appending = False

    def rows() -> Iterable[tuple]:
        """The events up to the head: the head is read after the events (it commits with them),
        and the events it has moved on to since are read in another pass."""
        nonlocal head, appending
        for _ in range(MAX_PASSES):
            read_any = False
            for row in _stream(chain, expected_seq):
                read_any = True
                yield row
            head = AuditChainHead.objects.filter(chain=chain).values_list("seq", "hash").first()
            if head is None or head[0] <= result.count or not read_any:
                return
        appending = True

    read = (reader := JSONReader()).read
    sha256 = hashlib.sha256
    for row in rows():
        (pk, seq, occurred_at, organization_id, workspace_id, actor_type, actor_id,
         actor_token_id, actor_label, action, target_type, target_id, target_repr, changes,
         metadata, request_id, ip, user_agent, link, stored_hash, version) = row  # fmt: skip
        problem = None
        if seq != expected_seq:
            problem = f"sequence gap: expected seq {expected_seq}, found {seq}"
        elif seq == result.since_seq:
            pass  # the checkpoint vouches for this event and all before it (checked below)
        elif link != prev_hash:
            problem = "prev_hash does not match the previous event's hash"
        else:
            reader.saw_float = False
            try:
                payload = {
                    "chain": chain, "seq": seq, "occurred_at": occurred_text(occurred_at),
                    "organization_id": organization_id, "workspace_id": workspace_id,
                    "actor_type": actor_type, "actor_id": actor_id,
                    "actor_token_id": actor_token_id, "actor_label": actor_label,
                    "action": action, "target_type": target_type, "target_id": target_id,
                    "target_repr": target_repr, "changes": read(changes),
                    "metadata": read(metadata), "request_id": request_id, "ip": ip,
                    "user_agent": user_agent,
                }  # fmt: skip
                if version == HASH_V2_RFC8785:
                    payload["hash_version"] = HASH_V2_RFC8785
                    data = link.encode() + canonical_v2(payload, has_float=reader.saw_float)
                elif version == HASH_V1_JSON_DUMPS:
                    data = (link + canonical_json(payload)).encode()
                else:
                    raise ValueError(f"unknown hash version {version}")
            except (ValueError, TypeError) as exc:  # content no version can hash
                problem = f"cannot recompute the hash: {exc}"
            else:
                if sha256(data).hexdigest() != stored_hash:
                    problem = "stored hash does not match the event's content"
                else:
                    result.checked += 1
        if problem is None and (signed := checkpoints.get(seq)) is not None:
            if (signed.head_hash, signed.last_event_id) != (stored_hash, pk):
                problem = f"the event no longer has the hash checkpoint #{signed.pk} signed"
            else:
                result.checkpoints += 1
        if problem:
            return _broken(result, pk, seq, action, problem)
        prev_hash, expected_seq = stored_hash, expected_seq + 1
        result.count, result.last_event_id, result.head_hash = seq, pk, stored_hash

    if since_checkpoint and checkpoints and result.count < result.since_seq:
        return _broken(result, None, result.since_seq, None, "the checkpoint's event is missing")
    beyond = [seq for seq in checkpoints if seq > result.count]
    if beyond:
        reason = f"a checkpoint signed seq {min(beyond)} but the chain ends at {result.count}"
        return _broken(result, None, min(beyond), None, reason)
    if head is not None and head[0] < result.count:
        reason = f"events beyond the chain head (seq {head[0]})"
        return _broken(result, None, head[0] + 1, None, reason)
    if head is not None and head[0] == result.count and head[1] != result.head_hash:
        return _broken(result, None, result.count, None, "the chain head's hash differs")
    if head is not None and head[0] > result.count and not appending:
        reason = f"chain head is at seq {head[0]} but only {result.count} events follow the chain"
        return _broken(result, None, result.count + 1, None, reason)
    return result


def _broken(
    result: VerifyResult, pk: int | None, seq: int, action: str | None, reason: str
) -> VerifyResult:
    result.ok = False
    result.first_broken = {"id": pk, "seq": seq, "action": action, "reason": reason}
    return result


def org_chain(organization_id: int | None) -> str:
    return f"org:{organization_id}" if organization_id else "global"
