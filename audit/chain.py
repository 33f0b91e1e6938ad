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

import contextlib
import dataclasses
import datetime
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import rfc8785
from django.db import transaction

from .models import GENESIS_HASH, HASH_V1_JSON_DUMPS, HASH_V2_RFC8785, AuditChainHead, AuditEvent

HASHED_FIELDS = (
    "chain", "seq", "occurred_at", "organization_id", "workspace_id", "actor_type", "actor_id",
    "actor_token_id", "actor_label", "action", "target_type", "target_id", "target_repr",
    "changes", "metadata", "request_id", "ip", "user_agent",
)  # fmt: skip

_CHANGES, _METADATA = HASHED_FIELDS.index("changes"), HASHED_FIELDS.index("metadata")
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

# Where Python's own compact, sorted JSON prints a payload exactly as RFC 8785 does: every number
# an integer of at most 15 digits (RFC 8785 prints floats the ECMAScript way, and integers
# beyond 2**53 take a tag), no key that starts with ``$`` (it takes one more), and no character
# from U+D800 up (lone surrogates take a tag, and from there UTF-16 orders keys unlike code
# points). Strings are escaped alike: only ``"``, ``\`` and the controls, in the same spellings
# (tests/audit/test_canonical.py holds the two to it). Each test is conservative: a string
# holding ``"$`` takes the slow road too, which is exact.
_string = json.encoder.encode_basestring  # type: ignore[attr-defined]  # the C escaper
# Python's C encoder, made once (json.dumps makes one per call): sorted keys, compact.
_compact_chunks = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, None, _string, None, ":", ",", True, False, False
)
_LONGEST_PLAIN = 10**15


def _plain(text: str) -> bool:
    return '"$' not in text and (text.isascii() or max(text) < "\ud800")


def _integer(value: int | None) -> str:
    return "null" if value is None else str(value)


def _json(value: Any) -> str:
    return "{}" if value == {} else "".join(_compact_chunks(value, 0))


def _skeleton(
    chain: str, seq: int, occurred_at: str, organization_id: int | None,
    workspace_id: int | None, actor_type: str, actor_id: int | None,
    actor_token_id: int | None, actor_label: str, action: str, target_type: str,
    target_id: str, target_repr: str, request_id: str, ip: str | None, user_agent: str,
    hash_version: int,
) -> tuple[str, str, str, bool]:  # fmt: skip
    """The version 2 form around ``changes`` and ``metadata``: the text before the one, between
    them and after the other, keys in their sorted order; and whether every integer in it is
    plain. :data:`_SKELETON_SQL` prints the same from a stored row."""
    head = (
        f'{{"action":{_string(action)},"actor_id":{_integer(actor_id)},'
        f'"actor_label":{_string(actor_label)},"actor_token_id":{_integer(actor_token_id)},'
        f'"actor_type":{_string(actor_type)},"chain":{_string(chain)},"changes":'
    )
    middle = (
        f',"hash_version":{hash_version},"ip":{"null" if ip is None else _string(ip)},"metadata":'
    )
    tail = (
        f',"occurred_at":{_string(occurred_at)},"organization_id":{_integer(organization_id)},'
        f'"request_id":{_string(request_id)},"seq":{seq},"target_id":{_string(target_id)},'
        f'"target_repr":{_string(target_repr)},"target_type":{_string(target_type)},'
        f'"user_agent":{_string(user_agent)},"workspace_id":{_integer(workspace_id)}}}'
    )
    numbers = (seq, organization_id, workspace_id, actor_id, actor_token_id)
    plain = all(n is None or -_LONGEST_PLAIN < n < _LONGEST_PLAIN for n in numbers)
    return head, middle, tail, plain


# The same skeleton printed by PostgreSQL from a stored row, for verify: to_json escapes a string
# as Python's escaper does (only ``"``, ``\`` and the controls, ``\u00xx`` in lower case) and
# prints inet as Django reads it; an integer prints its digits. Were the two ever to differ,
# the hash would not match: a false alarm, never a pass.
_SKELETON_SQL = """
'{"action":' || to_json(action) || ',"actor_id":' || coalesce(actor_id::text, 'null')
|| ',"actor_label":' || to_json(actor_label)
|| ',"actor_token_id":' || coalesce(actor_token_id::text, 'null')
|| ',"actor_type":' || to_json(actor_type) || ',"chain":' || to_json(chain) || ',"changes":',
',"hash_version":' || hash_version::text || ',"ip":' || coalesce(to_json(ip)::text, 'null')
|| ',"metadata":',
',"occurred_at":"'
|| to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
|| '","organization_id":' || coalesce(organization_id::text, 'null')
|| ',"request_id":' || to_json(request_id) || ',"seq":' || seq::text
|| ',"target_id":' || to_json(target_id) || ',"target_repr":' || to_json(target_repr)
|| ',"target_type":' || to_json(target_type) || ',"user_agent":' || to_json(user_agent)
|| ',"workspace_id":' || coalesce(workspace_id::text, 'null') || '}',
greatest(abs(seq), abs(organization_id), abs(workspace_id), abs(actor_id),
         abs(actor_token_id)) < 1000000000000000
"""


def _from_skeleton(
    version: int, head: str, middle: str, tail: str, changes: Any, metadata: Any, plain: bool
) -> bytes:
    """What the hash covers after ``prev_hash``, in ``version``, from the skeleton and the
    decoded JSON values; ``plain`` when every number in them is (:class:`JSONReader`)."""
    if version == HASH_V2_RFC8785 and plain:
        text = head + _json(changes) + middle + _json(metadata) + tail
        if _plain(text):
            return text.encode()
    payload = json.loads(head + "null" + middle + "null" + tail)  # the other fields' values
    payload["changes"], payload["metadata"] = changes, metadata
    if version == HASH_V2_RFC8785:
        return rfc8785.dumps(jcs_input(payload))
    if version == HASH_V1_JSON_DUMPS:
        del payload["hash_version"]
        return canonical_json(payload).encode()
    raise ValueError(f"unknown hash version {version}")


def canonical_v2(values: Sequence[Any], *, plain_numbers: bool) -> bytes:
    """RFC 8785 of ``jcs_input`` of the payload: the bytes version 2 hashes after ``prev_hash``.
    ``values`` are those of :data:`HASHED_FIELDS` in order (``occurred_at`` as
    :func:`occurred_text`), then the hash version; ``plain_numbers`` says that every number in
    the JSON values is an integer of at most 15 digits (:class:`JSONReader` knows)."""
    *fields, version = values
    changes, metadata = fields[_CHANGES], fields[_METADATA]
    del fields[_CHANGES : _METADATA + 1]
    head, middle, tail, plain = _skeleton(*fields, version)
    return _from_skeleton(version, head, middle, tail, changes, metadata, plain and plain_numbers)


def _numeric(text: str) -> int | float:
    """A JSON number as PostgreSQL's jsonb gives it back: ``numeric`` prints no exponent, so a
    number whose exponent leaves no fractional digit comes back an integer (``1e+16`` →
    ``10000000000000000``), and it has no negative zero."""
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and len(mantissa.partition(".")[2]) <= int(exponent):
        return int(Decimal(text))
    return float(text) or 0.0


class JSONReader:
    """Decodes stored JSON text, and notes in ``plain_numbers`` whether every number it read
    was an integer of at most 15 digits, which is what :func:`canonical_v2` needs to know.
    ``numeric=True`` decodes as PostgreSQL's jsonb would store the text (the writer's
    prediction); ``False`` as Django reads stored text back (``json.loads``)."""

    def __init__(self, *, numeric: bool = False) -> None:
        self.plain_numbers = True
        convert: Callable[[str], Any] = _numeric if numeric else float

        def parse_float(text: str) -> Any:
            self.plain_numbers = False
            return convert(text)

        def parse_int(text: str) -> int:
            if len(text) > 15:
                self.plain_numbers = False
            return int(text)

        self._scan = json.JSONDecoder(parse_float=parse_float, parse_int=parse_int).scan_once

    def read(self, text: str) -> Any:
        """The value of ``text``, a JSON document as json.dumps or jsonb prints it (no
        surrounding white space)."""
        if text == "{}":
            return {}
        try:
            value, end = self._scan(text, 0)
        except StopIteration as exc:
            raise ValueError(f"not JSON: {text[:40]!r}") from exc
        if end != len(text):
            raise ValueError(f"not JSON: {text[:40]!r}")
        return value


def stored_json(values: Any, *, numeric: bool) -> tuple[Any, bool]:
    """``values`` as the database will give them back once stored, and whether all their
    numbers are plain (:class:`JSONReader`). Datetimes, decimals and UUIDs become strings
    first, as they always have (``default=str``); NaN and infinities, which no JSON column
    stores, are refused here. On PostgreSQL (``numeric``) the numbers take jsonb's form
    (:func:`_numeric`); other databases store the JSON text itself."""
    text = json.dumps(values, default=str, allow_nan=False, ensure_ascii=False)
    reader = JSONReader(numeric=numeric)
    return reader.read(text), reader.plain_numbers


def occurred_text(occurred_at: datetime.datetime) -> str:
    return occurred_at.isoformat(timespec="microseconds")


def event_payload(event: AuditEvent) -> dict[str, Any]:
    payload = {name: getattr(event, name) for name in HASHED_FIELDS}
    payload["occurred_at"] = occurred_text(event.occurred_at)
    return payload


def event_hash(prev_hash: str, event: AuditEvent) -> str:
    """The event's hash in its own ``hash_version``; ValueError for a version this code lacks."""
    values = [*event_payload(event).values(), event.hash_version]
    return hashlib.sha256(prev_hash.encode() + hash_input(values)).hexdigest()


def hash_input(values: Sequence[Any]) -> bytes:
    """What an event's hash covers after its ``prev_hash``, in its own version: ``values`` are
    those of :data:`HASHED_FIELDS` in order, then the version."""
    version = values[-1]
    if version == HASH_V2_RFC8785:
        return canonical_v2(values, plain_numbers=False)
    if version == HASH_V1_JSON_DUMPS:
        return canonical_json(dict(zip(HASHED_FIELDS, values, strict=False))).encode()
    raise ValueError(f"unknown hash version {version}")


# --- verify -------------------------------------------------------------------------------------

# What verify reads of each event: its id, links, seq, action and hash version, the JSON
# columns as stored text, and the skeleton around them (:func:`_skeleton`).
_LEAD = ("id", "prev_hash", "hash", "seq", "action", "hash_version", "changes", "metadata")
_SKELETON_FIELDS = tuple(
    name for name in HASHED_FIELDS if name not in ("chain", "changes", "metadata")
)
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
    """The chain's events from ``from_seq`` on, in order, as tuples of :data:`_LEAD` then the
    skeleton (head, middle, tail, plain), read through a server-side cursor (on PostgreSQL) so
    memory stays flat whatever the length. PostgreSQL prints the skeleton itself: fewer
    columns to read, and no datetime made and printed per event."""
    from django.db import connection

    quote = connection.ops.quote_name
    postgresql = connection.vendor == "postgresql"
    columns = [quote(c) for c in _LEAD]
    if postgresql:
        columns.append(_SKELETON_SQL)
    else:
        columns += [quote(c) for c in _SKELETON_FIELDS]
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(AuditEvent._meta.db_table)}"
        " WHERE chain = %s AND seq >= %s ORDER BY seq"
    )
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [chain, from_seq])
        if not postgresql:
            lead, at = len(_LEAD), _SKELETON_FIELDS.index("occurred_at") + len(_LEAD)
            while rows := cursor.fetchmany(CHUNK_SIZE):
                for r in rows:
                    fields = [*r[lead:at], occurred_text(_from_sqlite(r[at])), *r[at + 1 :]]
                    yield (*r[:lead], *_skeleton(chain, *fields, r[5]))
            return
        # The next chunk is fetched while this one is checked: the server reads and prints
        # rows on its own core, and the fetch waits for it without the GIL.
        with ThreadPoolExecutor(max_workers=1) as fetcher:
            fetch = cursor.cursor.fetchmany  # psycopg's own cursor: Django's is per thread
            pending = fetcher.submit(fetch, CHUNK_SIZE)
            while rows := pending.result():
                pending = fetcher.submit(fetch, CHUNK_SIZE)
                yield from rows


def _from_sqlite(value: str | datetime.datetime) -> datetime.datetime:
    """SQLite's stored datetime (naive UTC, as Django writes it), as Django reads it back."""
    from django.utils.dateparse import parse_datetime

    parsed = parse_datetime(value) if isinstance(value, str) else value
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    return parsed.replace(tzinfo=datetime.UTC)


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

    def read_head() -> tuple[int, str] | None:
        return AuditChainHead.objects.filter(chain=chain).values_list("seq", "hash").first()

    def rows() -> Iterable[tuple]:
        """The events up to the head. The head commits with its events, so every event up to
        the head read before a pass is there to read; if the head moved on meanwhile, the new
        events are read in another pass."""
        nonlocal head, appending
        for _ in range(MAX_PASSES):
            before = read_head()
            yield from _stream(chain, expected_seq)
            head = read_head()
            if head is None or head[0] <= result.count:
                return
            if before is not None and result.count < before[0]:
                return  # events missing: the head's check below names it
        appending = True

    reader = JSONReader()
    sha256 = hashlib.sha256
    # Not WITH HOLD (Django's choice outside a transaction), which would copy every row out
    # before the first is read.
    with transaction.atomic(), contextlib.closing(rows()) as stream:
        for row in stream:
            (pk, link, stored_hash, seq, action, version, changes, metadata, head, middle, tail,
             plain) = row  # fmt: skip
            problem = None
            if seq != expected_seq:
                problem = f"sequence gap: expected seq {expected_seq}, found {seq}"
            elif seq == result.since_seq:
                pass  # the checkpoint vouches for this event and all before it (checked below)
            elif link != prev_hash:
                problem = "prev_hash does not match the previous event's hash"
            else:
                reader.plain_numbers = True
                try:
                    changes, metadata = reader.read(changes), reader.read(metadata)
                    plain = plain and reader.plain_numbers
                    data = link.encode() + _from_skeleton(
                        version, head, middle, tail, changes, metadata, plain
                    )
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
