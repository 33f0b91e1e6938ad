"""The fast road to the version 2 form gives RFC 8785's bytes exactly, and the writer's
prediction of what jsonb stores is what jsonb stores."""

import json

import rfc8785
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit import services as audit
from audit.chain import (
    HASHED_FIELDS,
    JSONReader,
    canonical_v2,
    jcs_input,
    org_chain,
    stored_json,
    verify_chain,
)
from audit.context import Actor, RequestContext, reset_request, set_request
from audit.services import _around_seq
from tests.audit.test_hash_versions import JSON_VALUES, KEYS
from tests.conftest import SYSTEM

# Strings as the text columns hold them: quotes, backslashes, controls, any plane (no NUL and no
# lone surrogate, which PostgreSQL refuses).
COLUMN_TEXT = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20
) | st.sampled_from(['"$x', "\\", "\x7f", "\u2028", "\ue000", "\U0001f600", ',"seq":0,'])
IDS = st.none() | st.integers(min_value=1, max_value=2**63 - 1) | st.integers(1, 10**6)
STORED_JSON = JSON_VALUES.filter(lambda v: "\x00" not in json.dumps(v))


def _values(texts, ids, changes, metadata):
    """A row of HASHED_FIELDS then the version, the JSON columns as stored text."""
    return [
        "org:1", ids[0] or 1, "2026-01-02T03:04:05.000006+00:00", ids[1], ids[2], texts[0],
        ids[3], ids[4], texts[1], texts[2], texts[3], texts[4], texts[5],
        json.dumps(changes), json.dumps(metadata), texts[6], None, texts[7], 2,
    ]  # fmt: skip


@settings(max_examples=300, deadline=None, database=None)
@given(
    texts=st.lists(COLUMN_TEXT, min_size=8, max_size=8),
    ids=st.lists(IDS, min_size=5, max_size=5),
    changes=STORED_JSON,
    metadata=st.dictionaries(KEYS, STORED_JSON, max_size=3),
)
def test_the_fast_road_prints_what_rfc8785_prints(texts, ids, changes, metadata):
    values = _values(texts, ids, changes, metadata)
    reader = JSONReader()
    values[13], values[14] = reader.read(values[13]), reader.read(values[14])
    fast = canonical_v2(values, plain_numbers=reader.plain_numbers)
    payload = dict(zip(HASHED_FIELDS, values, strict=False))
    payload["hash_version"] = 2
    assert fast == rfc8785.dumps(jcs_input(payload))
    if values[1] <= 2**53 - 1:  # a seq RFC 8785 prints as its digits (the append needs no more)
        zero = [*values[:1], 0, *values[2:]]
        before, after = _around_seq(canonical_v2(zero, plain_numbers=False))
        assert before + str(values[1]).encode() + after == fast


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=STORED_JSON)
def test_the_prediction_of_jsonb_is_jsonb(db, value):
    predicted, _ = stored_json(value, numeric=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb", [json.dumps(value)])
        stored = json.loads(cursor.fetchone()[0])
    assert rfc8785.dumps(jcs_input(predicted)) == rfc8785.dumps(jcs_input(stored))
    assert json.dumps(predicted, sort_keys=True) == json.dumps(stored, sort_keys=True)


def test_seq_look_alikes_in_the_content_do_not_move_the_split(world):
    audit.record(
        actor=SYSTEM,
        action="org.update",
        target=world.org,
        organization=world.org,
        target_repr=',"seq":0,',
        changes={"seq": 0, ',"seq":0,': [',"seq":0,']},
        metadata={"seq": 0},
    )
    assert verify_chain(org_chain(world.org.pk)).ok


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    texts=st.lists(COLUMN_TEXT, min_size=4, max_size=4),
    ip=st.sampled_from([None, "10.0.0.1", "::1", "2001:db8::8a2e:370:7334"]),
    changes=st.dictionaries(KEYS, STORED_JSON, max_size=3),
)
def test_verify_prints_every_stored_string_as_the_writer_did(world, texts, ip, changes):
    """Verify has PostgreSQL print the fields around the JSON columns (to_json): any string a
    text column holds, and any address, comes out as the writer printed it."""
    token = set_request(RequestContext(request_id=texts[0][:64], ip=ip, user_agent=texts[1][:512]))
    try:
        audit.record(
            actor=Actor.system(texts[2]),
            action="org.update",
            target=world.org,
            organization=world.org,
            target_repr=texts[3] or "x",
            changes=changes,
        )
    finally:
        reset_request(token)
    result = verify_chain(org_chain(world.org.pk))
    assert result.ok, result.first_broken
