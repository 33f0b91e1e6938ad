"""Idempotency-Key on the POSTs that create: a retry gets the first response back and nothing
is created twice; a reused key with another body is a 409; a failed create frees its key."""

import pytest

from audit.models import AuditEvent
from notifications.models import WebhookEndpoint
from workspaces.models import IdempotencyRecord, Workspace

WORKSPACES = "/api/v1/orgs/acme/workspaces/"


def post(client, path, body, key):
    return client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_retry_replays_the_first_response(world):
    client = world.client("owner")
    body = {"slug": "retry-me", "name": "Retry"}
    first = post(client, WORKSPACES, body, "k-1")
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    again = post(client, WORKSPACES, body, "k-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert Workspace.objects.filter(slug="retry-me").count() == 1
    assert AuditEvent.objects.filter(action="workspace.create", target_repr__contains="retry-me")
    assert (
        AuditEvent.objects.filter(
            action="workspace.create", target_id=str(first.json()["id"])
        ).count()
        == 1
    )


def test_the_same_key_with_another_body_is_refused(world):
    client = world.client("owner")
    assert post(client, WORKSPACES, {"slug": "one", "name": "One"}, "k-2").status_code == 201
    reused = post(client, WORKSPACES, {"slug": "two", "name": "Two"}, "k-2")
    assert reused.status_code == 409
    assert reused.json()["type"] == "idempotency_key_reused"
    assert "Idempotency-Key" in reused.json()["errors"]
    assert not Workspace.objects.filter(slug="two").exists()


def test_a_failed_create_leaves_the_key_free(world):
    client = world.client("owner")
    bad = post(client, WORKSPACES, {"slug": "Not A Slug"}, "k-3")
    assert bad.status_code == 400 and "slug" in bad.json()["errors"]
    assert not IdempotencyRecord.objects.filter(key="k-3").exists()
    assert post(client, WORKSPACES, {"slug": "fixed", "name": "F"}, "k-3").status_code == 201


def test_keys_belong_to_one_user_and_are_bounded(world):
    body = {"slug": "mine", "name": "Mine"}
    assert post(world.client("owner"), WORKSPACES, body, "shared").status_code == 201
    other = post(world.client("org_admin"), WORKSPACES, {"slug": "theirs"}, "shared")
    assert other.status_code == 201 and "Idempotent-Replayed" not in other
    long = post(world.client("owner"), WORKSPACES, {"slug": "x"}, "k" * 256)
    assert long.status_code == 400 and "Idempotency-Key" in long.json()["errors"]


@pytest.mark.parametrize("key", ["a\x00b", "line\nbreak", "caf\u00e9", "\ud800"])
def test_a_key_that_is_not_printable_ascii_is_refused_and_changes_nothing(world, key):
    response = post(world.client("owner"), WORKSPACES, {"slug": "hostile", "name": "H"}, key)
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["Idempotency-Key"] == ["1 to 255 printable ASCII characters"]
    assert not Workspace.objects.filter(slug="hostile").exists()
    assert not IdempotencyRecord.objects.exists()


def test_a_webhook_retry_gets_the_same_secret_and_one_endpoint(world, settings):
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    client = world.client("ws_admin")
    path = "/api/v1/orgs/acme/workspaces/ml/webhooks/"
    body = {"url": "http://127.0.0.1:9/hook"}
    first = post(client, path, body, "hook-1")
    assert first.status_code == 201, first.content
    again = post(client, path, body, "hook-1")
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["secret"] == first.json()["secret"].strip() != ""
    assert WebhookEndpoint.objects.filter(workspace=world.ws).count() == 1
    stored = IdempotencyRecord.objects.get(key="hook-1").response_encrypted
    assert first.json()["secret"] not in stored  # kept encrypted
