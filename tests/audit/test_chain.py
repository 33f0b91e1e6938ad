"""The audit log is tamper-evident: verify names the first broken link."""

import itertools

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from audit.chain import org_chain, verify_chain
from audit.models import AuditEvent
from tests.conftest import SYSTEM
from workspaces import services


@pytest.fixture(autouse=True)
def trail(world):
    """What these tests read: the trail the services leave in Acme's chain when a workspace is
    created and four roles are granted in it."""
    workspace = services.workspace_create(actor=SYSTEM, organization=world.org, slug="audited")
    for who, role in [("ws_admin", "admin"), ("developer", "developer"),
                      ("developer2", "developer"), ("viewer", "viewer")]:  # fmt: skip
        services.member_add(
            actor=SYSTEM, workspace=workspace, email=world.users[who].email, role=role
        )


def test_events_chain_and_verify(world):
    chain = org_chain(world.org.pk)
    events = list(AuditEvent.objects.filter(chain=chain).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(events))
    result = verify_chain(chain)
    assert result.ok and result.checked == len(events)


def _tamper(sql, params):
    with connection.cursor() as cursor:  # the test runner's connection may (see tests/settings)
        cursor.execute(sql, params)


def test_tampered_content_is_named_by_verify(world):
    chain = org_chain(world.org.pk)
    victim = AuditEvent.objects.filter(chain=chain).order_by("seq")[2]
    _tamper(
        "UPDATE audit_auditevent SET changes = %s WHERE id = %s",
        ['{"role": [null, "admin"]}', victim.pk],
    )
    result = verify_chain(chain)
    assert not result.ok
    assert result.first_broken["id"] == victim.pk
    assert "content" in result.first_broken["reason"]
    response = world.client("owner").get(f"/api/v1/orgs/{world.org.slug}/audit-events/verify/")
    assert response.json()["first_broken"]["id"] == victim.pk
    with pytest.raises(CommandError):
        call_command("audit_verify", org=world.org.slug)


def test_deleted_event_breaks_the_chain(world):
    chain = org_chain(world.org.pk)
    victim = AuditEvent.objects.filter(chain=chain).order_by("seq")[1]
    _tamper("DELETE FROM audit_auditevent WHERE id = %s", [victim.pk])
    result = verify_chain(chain)
    assert not result.ok
    assert result.first_broken["seq"] == victim.seq + 1
    assert "gap" in result.first_broken["reason"]


def test_verify_command_ok(world, capsys):
    call_command("audit_verify")
    out = capsys.readouterr().out
    assert f"org:{world.org.pk}: ok" in out


def test_list_filters(world):
    client = world.client("owner")
    url = f"/api/v1/orgs/{world.org.slug}/audit-events/"
    adds = client.get(url, {"action": "member.add"}).json()
    assert adds["count"] == 4
    assert {e["workspace"] for e in adds["results"]} == {"audited"}
    prefix = client.get(url, {"action": "member."}).json()
    assert prefix["count"] == 4
    by_target = client.get(url, {"target_type": "workspace"}).json()
    assert [e["action"] for e in by_target["results"]] == ["workspace.create"]
    future = client.get(url, {"since": "2999-01-01T00:00:00Z"}).json()
    assert future["count"] == 0
    bad = client.get(url, {"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.json()["errors"]
    # one org never sees another's events
    assert all(
        e["actor"]["label"] != "owner@globex.test" for e in client.get(url).json()["results"]
    )


def test_export_jsonl_and_csv(world):
    client = world.client("owner")
    url = f"/api/v1/orgs/{world.org.slug}/audit-events/export/"
    jsonl = b"".join(client.get(url, {"format": "jsonl"}).streaming_content).decode()
    lines = jsonl.strip().splitlines()
    assert len(lines) == AuditEvent.objects.filter(organization=world.org).count()
    csv_text = b"".join(client.get(url, {"format": "csv"}).streaming_content).decode()
    assert csv_text.splitlines()[0].startswith("id,seq,occurred_at,action")
    bad = client.get(url, {"format": "xml"})
    assert bad.status_code == 400 and "format" in bad.json()["errors"]


def test_request_id_round_trip(world):
    response = world.client("owner").patch(
        f"/api/v1/orgs/{world.org.slug}/", {"name": "Acme 2"}, format="json",
        HTTP_X_REQUEST_ID="req-abcdef123",
    )  # fmt: skip
    assert response["X-Request-ID"] == "req-abcdef123"
    event = AuditEvent.objects.filter(action="org.update").latest("id")
    assert event.request_id == "req-abcdef123"
    assert event.changes == {"name": ["Acme", "Acme 2"]}
    assert event.ip == "127.0.0.1"
