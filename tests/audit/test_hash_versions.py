"""The hash covers the values as stored: whatever form PostgreSQL's jsonb gives a value back in,
the chain verifies; old (version 1) rows verify as they did; tampering is still named."""

import datetime
import decimal
import hashlib
import uuid

import pytest
import rfc8785
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit import services as audit
from audit.chain import HASHED_FIELDS, event_hash, jcs_input, org_chain, verify_chain
from audit.context import Actor
from audit.models import HASH_V1_JSON_DUMPS, HASH_V2_RFC8785, AuditChainHead, AuditEvent
from tests.audit.old_writer import append_v1_event, v1_hash
from tests.conftest import SYSTEM


def _verify_url(world):
    return f"/api/v1/orgs/{world.org.slug}/audit-events/verify/"


def _tamper(sql, params):
    with connection.cursor() as cursor:  # the test runner's connection may (see tests/settings)
        cursor.execute(sql, params)


# --- the regression: jsonb gives a number back in another form --------------------------------


def test_number_jsonb_gives_back_in_another_form_verifies(world):
    # The report was {"gpu": 1e16} (jsonb returns 10000000000000000); thresholds now stop at
    # 1e15, but -0.0 still comes back as 0.0 and broke the chain the same way. Approval
    # settings are the organisation's call (workspace_update), so its admin sets them.
    response = world.client("org_admin").patch(
        f"/api/v1/orgs/{world.org.slug}/workspaces/{world.ws.slug}/",
        {"approval_thresholds": {"gpu": -0.0}},
        format="json",
    )
    assert response.status_code == 200, response.json()
    event = AuditEvent.objects.filter(action="workspace.update").latest("id")
    assert str(event.changes["approval_thresholds"][1]["gpu"]) == "0.0"
    assert event.hash_version == HASH_V2_RFC8785
    written = AuditEvent(**{f.attname: getattr(event, f.attname) for f in event._meta.fields})
    written.changes = {"approval_thresholds": [{}, {"gpu": -0.0}]}
    assert v1_hash(event.prev_hash, written) != v1_hash(event.prev_hash, event)  # the old bug

    result = world.client("owner").get(_verify_url(world)).json()
    assert result["ok"] is True, result["first_broken"]
    assert result["checked"] == AuditEvent.objects.filter(chain=org_chain(world.org.pk)).count()
    call_command("audit_verify")  # raises CommandError (exit 1) on a broken chain
    call_command("audit_verify", org=world.org.slug)


def test_float_jsonb_gives_back_as_an_integer_verifies(world):
    event = audit.record(
        actor=SYSTEM,
        action="workspace.update",
        target=world.ws,
        workspace=world.ws,
        changes={"approval_thresholds": [{}, {"gpu": 1e16}]},
    )
    stored = AuditEvent.objects.get(pk=event.pk).changes["approval_thresholds"][1]["gpu"]
    assert stored == 10**16 and type(stored) is int
    assert verify_chain(org_chain(world.org.pk)).ok
    call_command("audit_verify", org=world.org.slug)


def test_a_batch_written_with_copy_verifies(world):
    # More than config.db.COPY_ABOVE entries: the admission pass's COPY path.
    entries = [
        {
            "action": "workspace.update",
            "target": world.ws,
            "workspace": world.ws,
            "changes": {"gpu": [i * 0.5, 1e16 + i], "tiny": 1e-7, "zero": -0.0},
        }
        for i in range(25)
    ]
    events = audit.record_many(actor=SYSTEM, organization=world.org, entries=entries)
    stored = AuditEvent.objects.get(chain=events[-1].chain, seq=events[-1].seq)
    assert stored.hash == events[-1].hash
    assert verify_chain(org_chain(world.org.pk)).ok


# --- any JSON value, stored and read back, verifies ------------------------------------------

TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
NUMBERS = (
    st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.sampled_from([2**53 - 1, 2**53, 2**53 + 1, -(2**63), 10**16, 10**21, 10**300])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e16, 1.0, -0.0, 1e-7, 1e300, 5e-324, 1.7976931348623157e308, 0.1])
)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
KEYS = TEXT | st.sampled_from(["$bigint", "$utf16", "$", "$$x"])
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=12,
)


@settings(
    max_examples=60,
    deadline=None,
    database=None,  # no example database: every run draws afresh
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=JSON_VALUES, metadata=st.dictionaries(KEYS, JSON_VALUES, max_size=3))
def test_any_json_value_stored_and_read_back_verifies(world, value, metadata):
    event = audit.record(
        actor=SYSTEM,
        action="workspace.update",
        target=world.ws,
        workspace=world.ws,
        changes={"value": value},
        metadata=metadata,
    )
    stored = AuditEvent.objects.get(pk=event.pk)
    assert event_hash(stored.prev_hash, stored) == stored.hash
    assert verify_chain(org_chain(world.org.pk)).ok


# --- the encoding of what RFC 8785 cannot print ----------------------------------------------


def test_integers_beyond_doubles_are_tagged_unless_printed_exactly():
    assert rfc8785.dumps(jcs_input([10**16, -(10**16), 2**53 - 1])) == (
        b"[10000000000000000,-10000000000000000,9007199254740991]"
    )
    assert jcs_input(2**53 + 1) == {"$bigint": "9007199254740993"}
    assert jcs_input(2**60) == {"$bigint": str(2**60)}  # a double, but printed 1152921504606847000
    assert jcs_input(10**400) == {"$bigint": "1" + "0" * 400}  # beyond the largest double


def test_tags_never_equal_a_stored_value():
    stored_tag_lookalike = {"$bigint": "9007199254740993"}
    assert jcs_input(stored_tag_lookalike) == {"$$bigint": "9007199254740993"}
    assert jcs_input(stored_tag_lookalike) != jcs_input(2**53 + 1)
    assert jcs_input({"\ud800": "\udfff"}) == {"$utf16:d800": {"$utf16": "dfff"}}
    assert jcs_input({"$utf16:d800": 1}) == {"$$utf16:d800": 1}


# --- version 1 rows ---------------------------------------------------------------------------


def test_old_events_verify_and_new_ones_chain_on(world):
    chain = org_chain(world.org.pk)
    for i in range(3):
        append_v1_event(
            AuditEvent,
            AuditChainHead,
            chain=chain,
            organization=world.org,
            changes={"name": [f"Acme {i}", f"Acme {i + 1}"], "limit": 2.5},
            hash_version=HASH_V1_JSON_DUMPS,
        )
    audit.record(
        actor=SYSTEM,
        action="org.update",
        target=world.org,
        organization=world.org,
        changes={"gpu": [None, 1e16]},
    )
    versions = list(
        AuditEvent.objects.filter(chain=chain)
        .order_by("seq")
        .values_list("hash_version", flat=True)
    )
    assert versions[-4:] == [1, 1, 1, 2]
    result = verify_chain(chain)
    assert result.ok and result.checked == len(versions)


def test_version_2_hash_is_rfc8785_of_the_stored_payload(world):
    # Written out, so a change to the canonical form cannot pass unnoticed: it would orphan
    # every version 2 row already stored.
    event = audit.record(
        actor=Actor.system("t"),
        action="org.update",
        target=world.org,
        organization=world.org,
        changes={"limit": [None, 1e15], "ratio": 0.5},
    )
    stored = AuditEvent.objects.get(pk=event.pk)
    payload = {name: getattr(stored, name) for name in HASHED_FIELDS}
    payload["occurred_at"] = stored.occurred_at.isoformat(timespec="microseconds")
    payload["hash_version"] = 2
    text = rfc8785.dumps(payload)
    assert b'"changes":{"limit":[null,1000000000000000],"ratio":0.5}' in text
    assert stored.hash == hashlib.sha256(stored.prev_hash.encode() + text).hexdigest()


# --- tampering with version 2 rows ------------------------------------------------------------


def _v2_victim(world):
    event = audit.record(
        actor=SYSTEM,
        action="workspace.update",
        target=world.ws,
        workspace=world.ws,
        changes={"gpu": [None, 1e16]},
    )
    audit.record(
        actor=SYSTEM,
        action="workspace.update",
        target=world.ws,
        workspace=world.ws,
        changes={"name": ["ML", "ML 2"]},
    )
    return event


@pytest.mark.parametrize(
    ("sql", "value"),
    [
        ("UPDATE audit_auditevent SET changes = %s WHERE id = %s", '{"gpu": [null, 1e15]}'),
        ("UPDATE audit_auditevent SET metadata = %s WHERE id = %s", '{"note": "added"}'),
        ("UPDATE audit_auditevent SET actor_label = %s WHERE id = %s", "someone else"),
        # relabelled to the old form: the version is part of what version 2 hashes
        ("UPDATE audit_auditevent SET hash_version = %s WHERE id = %s", 1),
    ],
)
def test_tampered_version_2_event_is_named_by_verify(world, sql, value):
    victim = _v2_victim(world)
    _tamper(sql, [value, victim.pk])
    result = verify_chain(org_chain(world.org.pk))
    assert not result.ok
    assert result.first_broken["id"] == victim.pk
    assert "content" in result.first_broken["reason"]
    response = world.client("owner").get(_verify_url(world))
    assert response.json()["first_broken"]["id"] == victim.pk
    with pytest.raises(CommandError):
        call_command("audit_verify", org=world.org.slug)


def test_unknown_hash_version_is_named(world):
    victim = _v2_victim(world)
    _tamper("UPDATE audit_auditevent SET hash_version = 9 WHERE id = %s", [victim.pk])
    result = verify_chain(org_chain(world.org.pk))
    assert result.first_broken["id"] == victim.pk
    assert "unknown hash version 9" in result.first_broken["reason"]


def test_values_no_json_column_stores_are_refused(world):
    with pytest.raises(ValueError, match="JSON compliant"):
        audit.record(
            actor=SYSTEM,
            action="org.update",
            target=world.org,
            organization=world.org,
            changes={"x": float("nan")},
        )


def test_non_json_values_are_stored_as_strings(world):
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    key = uuid.UUID(int=7)
    changes = {"at": when, "price": decimal.Decimal("1.10"), "id": key}
    event = audit.record(
        actor=SYSTEM, action="org.update", target=world.org, organization=world.org, changes=changes
    )
    assert AuditEvent.objects.get(pk=event.pk).changes == {
        "at": "2026-01-02 03:04:05+00:00",
        "price": "1.10",
        "id": str(key),
    }
    assert verify_chain(org_chain(world.org.pk)).ok
