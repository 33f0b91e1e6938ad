"""The webhook API: create (secret shown once), validation naming the field, deliveries with their
attempts, redeliver, ping, rotation, and a query budget for the deliveries list."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from notifications.models import WebhookDelivery

from .conftest import emit, make_endpoint, pump, verify

HOOKS = "/api/v1/orgs/acme/workspaces/ml/webhooks/"
ORG_HOOKS = "/api/v1/orgs/acme/webhooks/"


def test_create_shows_the_secret_once(world, receiver):
    client = world.client("ws_admin")
    body = {"url": receiver.url(), "event_types": ["job.failed"], "description": "tickets"}
    created = client.post(HOOKS, body, format="json")
    assert created.status_code == 201, created.content
    data = created.json()
    assert data["secret"].startswith("whsec_")
    assert data["event_types"] == ["job.failed"] and data["workspace"] == "ml"
    assert data["created_by"] == "wsadmin@acme.test" and data["enabled"] is True

    listed = client.get(HOOKS).json()["results"]
    assert [h["id"] for h in listed] == [data["id"]]
    assert "secret" not in listed[0]
    assert "secret" not in client.get(f"{HOOKS}{data['id']}/").json()
    org_level = world.client("owner").get(ORG_HOOKS).json()["results"]
    assert org_level == []  # a workspace endpoint is not an org-level one

    emit(world, "job.failed")
    pump()
    assert verify(data["secret"], receiver.requests[0].headers, receiver.requests[0].body)


def test_default_is_every_event_type(world, receiver):
    created = world.client("owner").post(HOOKS, {"url": receiver.url()}, format="json").json()
    assert created["event_types"] == ["*"]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({}, "url", "required"),
        ({"url": "not a url"}, "url", "valid URL"),
        ({"url": "ftp://127.0.0.1/x"}, "url", "https://"),
        ({"url": "http://127.0.0.1:1/", "event_types": ["job.exploded"]}, "event_types", "unknown"),
        ({"url": "http://127.0.0.1:1/", "event_types": []}, "event_types", "at least one"),
        ({"url": "http://127.0.0.1:1/", "event_types": "job.failed"}, "event_types", "list"),
        ({"url": "http://127.0.0.1:1/", "event_types": ["audit.event"]}, "event_types", "org"),
        ({"url": "http://127.0.0.1:1/", "event_types": ["*", "job.failed"]}, "event_types", "*"),
        ({"url": "http://127.0.0.1:1/", "enabled": "perhaps"}, "enabled", "boolean"),
        ({"url": "http://127.0.0.1:1/", "description": "x" * 501}, "description", "500"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(world, body, field, words):
    response = world.client("owner").post(HOOKS, body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert list(errors) == [field] or next(iter(errors)).startswith(field), errors
    assert words.lower() in " ".join(next(iter(errors.values()))).lower()


def test_audit_event_only_at_org_level(world, receiver):
    client = world.client("org_admin")
    body = {"url": receiver.url(), "event_types": ["audit.event", "job.failed"]}
    created = client.post(ORG_HOOKS, body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["workspace"] is None
    patch = {"event_types": ["audit.event"]}
    ws_hook = client.post(HOOKS, {"url": receiver.url()}, format="json").json()
    refused = client.patch(f"{HOOKS}{ws_hook['id']}/", patch, format="json")
    assert refused.status_code == 400 and list(refused.json()["errors"]) == ["event_types"]


def test_update_rechecks_the_url(world, settings, receiver):
    hook = world.client("owner").post(HOOKS, {"url": receiver.url()}, format="json").json()
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    same = world.client("owner").patch(f"{HOOKS}{hook['id']}/", {"description": "x"}, "json")
    assert same.status_code == 200
    moved = world.client("owner").patch(
        f"{HOOKS}{hook['id']}/", {"url": "http://10.0.0.1/"}, format="json"
    )
    assert moved.status_code == 400 and list(moved.json()["errors"]) == ["url"]


def test_deliveries_list_with_attempts_then_redeliver(world, receiver):
    receiver.replies = [(500, {}, b"nope")]
    endpoint, secret = make_endpoint(world, receiver.url())
    event = emit(world, "job.failed")
    pump()
    client = world.client("ws_admin")
    [row] = client.get(f"{HOOKS}{endpoint.pk}/deliveries/").json()["results"]
    assert row["webhook_id"] == f"msg_{event.pk.hex}"
    assert row["state"] == "succeeded" and row["attempt_count"] == 2
    assert [(a["status_code"], a["response_excerpt"]) for a in row["attempts"]] == [
        (500, "nope"),
        (200, "ok"),
    ]
    assert row["payload"]["type"] == "job.failed"
    assert row["payload"]["data"]["id"] == str(event.pk)
    assert row["payload"] == receiver.requests[0].json  # what was sent, byte for byte in JSON

    again = client.post(f"{HOOKS}{endpoint.pk}/deliveries/{row['id']}/redeliver/", format="json")
    assert again.status_code == 202 and again.json()["state"] == "pending"
    pump()
    assert len(receiver.requests) == 3
    assert receiver.requests[-1].headers["webhook-id"] == row["webhook_id"]
    assert verify(secret, receiver.requests[-1].headers, receiver.requests[-1].body)
    detail = client.get(f"{HOOKS}{endpoint.pk}/deliveries/{row['id']}/").json()
    assert detail["state"] == "succeeded" and len(detail["attempts"]) == 3


def test_ping(world, receiver):
    endpoint, secret = make_endpoint(world, receiver.url())
    response = world.client("owner").post(f"{HOOKS}{endpoint.pk}/ping/", format="json")
    assert response.status_code == 202, response.content
    assert response.json()["event_type"] == "webhook.ping"
    pump()
    [request] = receiver.requests
    assert request.json["type"] == "webhook.ping"
    assert request.json["data"]["webhook"] == endpoint.pk
    assert request.json["data"]["message"] == "ping from owner@acme.test"
    assert verify(secret, request.headers, request.body)


def test_ping_and_redeliver_refused_while_disabled(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    pump()
    client = world.client("owner")
    assert client.patch(f"{HOOKS}{endpoint.pk}/", {"enabled": False}, "json").status_code == 200
    ping = client.post(f"{HOOKS}{endpoint.pk}/ping/", format="json")
    assert ping.status_code == 409 and ping.json()["type"] == "conflict"
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    redeliver = client.post(f"{HOOKS}{endpoint.pk}/deliveries/{delivery.pk}/redeliver/")
    assert redeliver.status_code == 409


def test_rotate_secret_api(world, receiver):
    endpoint, old = make_endpoint(world, receiver.url())
    client = world.client("owner")
    url = f"{HOOKS}{endpoint.pk}/rotate-secret/"
    assert client.post(url, {"grace_period_seconds": -1}, "json").json()["errors"] == {
        "grace_period_seconds": ["Ensure this value is greater than or equal to 0."]
    }
    rotated = client.post(url, {"grace_period_seconds": 600}, format="json")
    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    emit(world)
    pump()
    request = receiver.requests[-1]
    assert len(request.signatures) == 2
    assert verify(old, request.headers, request.body) and verify(new, request.headers, request.body)


def test_other_tenants_and_endpoints_are_404(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url())
    assert world.client("foreign").get(f"{HOOKS}{endpoint.pk}/").status_code == 404
    org_url = f"{ORG_HOOKS}{endpoint.pk}/"  # a workspace endpoint is not reachable as org-level
    assert world.client("owner").get(org_url).status_code == 404
    missing = world.client("owner").get(f"{HOOKS}{endpoint.pk}/deliveries/999999/")
    assert missing.status_code == 404 and missing.json()["type"] == "not_found"


def test_deliveries_list_query_budget(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url())
    client = world.client("owner")

    def queries(page_size):
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(f"{HOOKS}{endpoint.pk}/deliveries/", {"page_size": page_size})
        assert len(response.json()["results"]) == page_size
        return len(ctx.captured_queries)

    for _ in range(12):
        emit(world)
    pump()
    client.get("/api/v1/me/")  # the token's last-used write happens once
    assert queries(2) == queries(12)


def test_me_notification_preferences(world):
    client = world.client("developer")
    me = client.get("/api/v1/me/").json()
    assert me["notification_preferences"] == {
        "job_approval_requested": True,
        "job_failed": True,
        "webhook_disabled": True,
    }
    changed = client.patch(
        "/api/v1/me/", {"notification_preferences": {"job_failed": False}}, format="json"
    )
    assert changed.status_code == 200
    assert changed.json()["notification_preferences"]["job_failed"] is False
    assert client.get("/api/v1/me/").json()["notification_preferences"]["job_failed"] is False
    audit = AuditEvent.objects.filter(action="user.notification_preferences").get()
    assert audit.actor_id == world.users["developer"].pk
    assert audit.changes["notification_preferences"][1]["job_failed"] is False
    bad = client.patch("/api/v1/me/", {"notification_preferences": {"spam": False}}, "json")
    assert bad.status_code == 400
    assert list(bad.json()["errors"]) == ["notification_preferences.spam"]
    not_bool = client.patch(
        "/api/v1/me/", {"notification_preferences": {"job_failed": "x"}}, "json"
    )
    assert not_bool.status_code == 400
    assert list(not_bool.json()["errors"]) == ["notification_preferences.job_failed"]


@pytest.mark.parametrize(
    "body",
    [
        ["not", "an", "object"],
        {"url": "http://127.0.0.1:99999/"},
        {"url": "http://[::1]/"},
        {"url": "http://xn--ls8h.invalid/"},
        {"url": "http://127.0.0.1:1/", "event_types": [None]},
        {"url": "http://127.0.0.1:1/", "event_types": [{"a": 1}]},
    ],
)
def test_odd_input_is_a_4xx_never_a_500(world, body):
    response = world.client("owner").post(HOOKS, body, format="json")
    assert response.status_code == 400, response.content
    assert set(response.json()) == {"type", "detail", "errors"}


def test_malformed_json_is_a_400(world):
    response = world.client("owner").post(HOOKS, "{nope", content_type="application/json")
    assert response.status_code == 400 and response.json()["type"] == "parse_error"
