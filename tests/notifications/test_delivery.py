"""Delivery to a real HTTP receiver on 127.0.0.1: signatures, retries, redirects, 410, rotation,
Retry-After, timeouts, exhaustion, auto-disable and leases."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.core import mail
from django.utils import timezone

from audit.context import Actor
from audit.models import AuditEvent
from notifications import delivery, services
from notifications.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

from .conftest import emit, make_endpoint, pump, verify


def test_signed_standard_webhooks_message(world, receiver):
    endpoint, secret = make_endpoint(world, receiver.url("/in?src=manta"))
    assert secret.startswith("whsec_") and len(secret) > len("whsec_") + 32
    event = emit(world, "job.succeeded", job={"id": 7, "name": "count"}, reason="", actor="x")
    pump()

    [request] = receiver.requests
    assert request.path == "/in?src=manta"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == f"msg_{event.pk.hex}"
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
    assert len(request.signatures) == 1
    assert verify(secret, request.headers, request.body)
    assert not verify("whsec_" + "A" * 44, request.headers, request.body)
    assert not verify(secret, request.headers, request.body + b" ")
    body = request.json
    assert body["type"] == "job.succeeded"
    assert body["timestamp"].startswith(event.occurred_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert body["data"]["id"] == str(event.pk)
    assert body["data"]["organization"] == "acme" and body["data"]["workspace"] == "ml"
    assert body["data"]["job"] == {"id": 7, "name": "count"}

    row = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (row.state, row.attempt_count, row.last_status_code) == ("succeeded", 1, 200)
    assert row.attempts.get().response_excerpt == "ok"


def test_500_three_times_then_200_delivers_on_the_fourth_attempt_with_the_same_id(world, receiver):
    receiver.replies = [(500, {}, b"boom")] * 3
    endpoint, secret = make_endpoint(world, receiver.url())
    emit(world)
    pump()

    assert len(receiver.requests) == 4
    assert len({r.headers["webhook-id"] for r in receiver.requests}) == 1
    assert all(verify(secret, r.headers, r.body) for r in receiver.requests)
    row = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (row.state, row.attempt_count) == ("succeeded", 4)
    codes = list(row.attempts.values_list("status_code", "response_excerpt"))
    assert codes == [(500, "boom"), (500, "boom"), (500, "boom"), (200, "ok")]
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.failing_since is None


def test_retry_schedule_spaces_attempts_then_exhausts(world, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 300, 1800]
    receiver.default = (502, {}, b"bad gateway")
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    before = timezone.now()
    pump()
    row = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (row.state, row.attempt_count) == ("pending", 1)
    assert before + dt.timedelta(seconds=299) < row.next_attempt_at
    assert row.next_attempt_at < timezone.now() + dt.timedelta(seconds=301)

    for expected_attempts in (2, 3):
        WebhookDelivery.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
        pump()
        row.refresh_from_db()
        assert row.attempt_count == expected_attempts
    assert row.state == "exhausted" and row.next_attempt_at is None
    assert len(receiver.requests) == 3


def test_redirect_is_not_followed_and_counts_as_failure(world, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 3600]
    receiver.replies = [(302, {"Location": receiver.url("/elsewhere")}, b"")]
    endpoint, _ = make_endpoint(world, receiver.url("/hook"))
    emit(world)
    pump()
    assert [r.path for r in receiver.requests] == ["/hook"]
    row = WebhookDelivery.objects.get(endpoint=endpoint)
    assert row.state == "pending" and row.round_failures == 1
    attempt = row.attempts.get()
    assert attempt.status_code == 302
    assert "not followed" in attempt.error


def test_410_disables_the_endpoint_and_emails_org_admins(
    world, receiver, django_capture_on_commit_callbacks, eager_tasks
):
    receiver.default = (410, {}, b"gone")
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    emit(world, "job.failed")
    with django_capture_on_commit_callbacks(execute=True):
        pump()
    assert len(receiver.requests) == 1  # the second message is not sent to a gone endpoint
    endpoint.refresh_from_db()
    assert not endpoint.enabled and "410" in endpoint.disabled_reason
    states = sorted(
        WebhookDelivery.objects.filter(endpoint=endpoint).values_list("state", flat=True)
    )
    assert states == ["failed", "pending"]
    audit = AuditEvent.objects.filter(action="webhook.disable").get()
    assert audit.actor_type == "system" and audit.target_id == str(endpoint.pk)
    to = sorted(m.to[0] for m in mail.outbox if "disabled" in m.subject)
    assert to == ["admin@acme.test", "owner@acme.test"]

    emit(world)
    pump()
    assert len(receiver.requests) == 1  # disabled: nothing more is sent


def test_reenabling_sends_what_waited(world, receiver):
    receiver.replies = [(410, {}, b"")]
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    emit(world, "job.failed")
    pump()
    services.webhook_update(
        actor=Actor.for_user(world.users["owner"]), endpoint=endpoint, data={"enabled": True}
    )
    pump()
    assert [r.json["type"] for r in receiver.requests] == [
        "job.succeeded",
        "job.failed",
    ]


def test_retry_after_on_429_is_honoured(world, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 5, 5]
    receiver.replies = [(429, {"Retry-After": "120"}, b"slow down")]
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    pump()
    row = WebhookDelivery.objects.get(endpoint=endpoint)
    wait = (row.next_attempt_at - timezone.now()).total_seconds()
    assert 110 < wait <= 120
    assert len(receiver.requests) == 1


def test_timeout_is_a_failure(world, receiver, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 3600]

    def slow(_request):
        time.sleep(1.5)
        return (200, {}, b"late")

    receiver.replies = [slow]
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    pump()
    attempt = WebhookAttempt.objects.get(delivery__endpoint=endpoint)
    assert attempt.status_code is None and attempt.error == "timed out"
    assert 400 <= attempt.duration_ms < 1400


def test_response_excerpt_is_bounded(world, receiver):
    receiver.default = (200, {}, b"x" * 200_000)
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    emit(world)
    pump()
    attempts = WebhookAttempt.objects.filter(delivery__endpoint=endpoint)
    assert [len(a.response_excerpt) for a in attempts] == [1024, 1024]


def test_rotation_sends_two_signatures_during_the_grace_period_then_one(world, receiver):
    endpoint, old = make_endpoint(world, receiver.url())
    actor = Actor.for_user(world.users["owner"])
    new, expires = services.webhook_rotate_secret(
        actor=actor, endpoint=endpoint, grace_period_seconds=3600
    )
    assert new != old and new.startswith("whsec_")
    emit(world)
    pump()
    during = receiver.requests[-1]
    assert len(during.signatures) == 2
    assert verify(old, during.headers, during.body) and verify(new, during.headers, during.body)

    endpoint.secrets.filter(expires_at=expires).update(expires_at=timezone.now())  # grace over
    emit(world)
    pump()
    after = receiver.requests[-1]
    assert len(after.signatures) == 1
    assert verify(new, after.headers, after.body) and not verify(old, after.headers, after.body)


def test_endpoint_failing_for_the_whole_window_is_disabled(
    world, receiver, settings, django_capture_on_commit_callbacks, eager_tasks
):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 0, 0, 3600]
    settings.WEBHOOK_DISABLE_AFTER_SECONDS = 5 * 86400
    receiver.default = (500, {}, b"")
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    pump()
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.failing_since is not None
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        failing_since=timezone.now() - dt.timedelta(days=5, seconds=1)
    )
    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        pump()
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_reason == "every attempt failed for 5 days"
    assert any("disabled" in m.subject for m in mail.outbox)


def test_a_success_clears_the_failure_streak(world, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 3600]
    receiver.replies = [(500, {}, b"")]
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    pump()
    endpoint.refresh_from_db()
    assert endpoint.failing_since is not None
    emit(world)
    pump()
    endpoint.refresh_from_db()
    assert endpoint.failing_since is None


def test_an_expired_lease_is_retried_and_its_lost_attempt_logged(world, receiver):
    endpoint, secret = make_endpoint(world, receiver.url())
    emit(world)
    from notifications import dispatch

    dispatch.events_dispatch()
    row = WebhookDelivery.objects.get(endpoint=endpoint)
    # a worker claimed it and died mid-request: its lease ran out
    WebhookDelivery.objects.filter(pk=row.pk).update(
        lease_until=timezone.now() - dt.timedelta(seconds=1)
    )
    pump()
    row.refresh_from_db()
    assert row.state == "succeeded" and row.attempt_count == 2
    lost, sent = row.attempts.all()
    assert "lost" in lost.error and lost.status_code is None
    assert sent.status_code == 200
    assert verify(secret, receiver.requests[0].headers, receiver.requests[0].body)


def test_a_live_lease_is_left_alone(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    from notifications import dispatch

    dispatch.events_dispatch()
    WebhookDelivery.objects.update(lease_until=timezone.now() + dt.timedelta(seconds=60))
    delivery.endpoint_deliver(endpoint.pk)
    assert receiver.requests == []


def test_deliveries_go_out_oldest_event_first(world, receiver):
    make_endpoint(world, receiver.url())
    kinds = ["job.submitted", "job.queued", "job.launching", "job.running", "job.succeeded"]
    for kind in kinds:
        emit(world, kind)
    pump()
    assert [r.json["type"] for r in receiver.requests] == kinds


def test_unreachable_receiver_is_a_failure_not_an_error(world, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 3600]
    endpoint, _ = make_endpoint(world, "http://127.0.0.1:9/closed")
    emit(world)
    pump()
    attempt = WebhookAttempt.objects.get(delivery__endpoint=endpoint)
    assert attempt.status_code is None and "refused" in attempt.error.lower()


@pytest.mark.parametrize("failures", [0, 1, 7, 8])
def test_retry_delay_follows_the_schedule_with_jitter(settings, failures):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 5, 300, 1800, 7200, 18000, 36000, 36000]
    settings.WEBHOOK_RETRY_JITTER = 0.2
    delay = delivery.retry_delay(failures)
    if failures >= 8:
        assert delay is None
    else:
        base = settings.WEBHOOK_RETRY_SCHEDULE[failures]
        assert base * 0.8 <= delay <= base * 1.2
