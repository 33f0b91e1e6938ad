"""Webhook endpoints and deliveries in the admin panel: visible to the admins of their org with
every attempt, hidden from others; an endpoint is changed, pinged and a delivery sent again only
through the notification services (checked, audited, the sending scheduled on commit), and the
signing secret is never shown."""

import pytest

from audit.models import AuditEvent
from notifications.models import DeliveryState, WebhookDelivery, WebhookEndpoint
from tests.admin_forms import act, login, messages_of, submit

from .conftest import emit, make_endpoint, pump

ENDPOINTS = "/admin/notifications/webhookendpoint/"
DELIVERIES = "/admin/notifications/webhookdelivery/"


def test_deliveries_are_shown_read_only_to_their_org_admins(world, receiver):
    endpoint, secret = make_endpoint(world, receiver.url("/hooks"))
    receiver.replies = [(500, {}, b"boom"), (200, {}, b"ok")]
    emit(world)
    pump()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    admin = login("admin@acme.test")
    endpoint_page = f"{ENDPOINTS}{endpoint.pk}/change/"
    delivery_page = f"{DELIVERIES}{delivery.pk}/change/"
    page = admin.get(delivery_page)
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert admin.post(delivery_page, {"state": "pending"}).status_code == 403
    attempts = page.content.decode()
    assert "boom" in attempts and "500" in attempts  # the failed attempt, then the success
    shown = admin.get(endpoint_page).content.decode()
    assert delivery_page in shown  # among the endpoint's recent deliveries
    assert secret not in shown and secret.removeprefix("whsec_") not in shown
    assert admin.get(f"{ENDPOINTS}add/").status_code == 403
    assert admin.get(f"{DELIVERIES}add/").status_code == 403
    assert delivery_page in admin.get(DELIVERIES).content.decode()
    foreign = login("owner@globex.test")
    assert foreign.get(endpoint_page).status_code in (302, 404)
    listing = foreign.get(DELIVERIES)
    assert listing.status_code == 200  # globex's owner administers globex, not acme
    assert delivery_page not in listing.content.decode()


def test_redeliver_requeues_through_the_service_and_sends_on_commit(
    world, receiver, django_capture_on_commit_callbacks, eager_tasks
):
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world, "job.failed")
    pump()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.state == DeliveryState.SUCCEEDED and len(receiver.requests) == 1
    admin = login("admin@acme.test")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        shown = act(admin, DELIVERIES, "redeliver", [delivery.pk])
        delivery.refresh_from_db()
        assert delivery.state == DeliveryState.PENDING and len(receiver.requests) == 1
    assert "Queued 1 delivery(ies) to be sent again." in shown
    assert callbacks  # the delivery task, scheduled on commit; run here, as the worker would
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.SUCCEEDED and delivery.attempt_count == 2
    assert [r.headers["webhook-id"] for r in receiver.requests] == [delivery.message_id] * 2
    event = AuditEvent.objects.get(action="webhook.redeliver")
    assert event.actor_id == world.users["org_admin"].pk
    assert event.metadata["delivery"] == delivery.pk


def test_redeliver_refused_while_disabled_and_foreign_rows_untouched(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url())
    emit(world)
    pump()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=False, disabled_reason="failing")
    shown = act(login("admin@acme.test"), DELIVERIES, "redeliver", [delivery.pk])
    assert any("the endpoint is disabled; enable it first" in m for m in shown)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=True)
    act(login("owner@globex.test"), DELIVERIES, "redeliver", [delivery.pk])  # not theirs
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.SUCCEEDED
    assert not AuditEvent.objects.filter(action="webhook.redeliver").exists()


def test_an_endpoint_is_changed_through_the_service_and_refusals_change_nothing(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url())
    admin = login("admin@acme.test")
    url = f"{ENDPOINTS}{endpoint.pk}/change/"
    changed = submit(admin, url, event_types='["job.failed"]', enabled=None)
    assert changed.status_code == 302, changed.content.decode()[:3000]
    endpoint.refresh_from_db()
    assert endpoint.event_types == ["job.failed"] and endpoint.enabled is False
    event = AuditEvent.objects.get(action="webhook.update")
    assert event.actor_id == world.users["org_admin"].pk
    assert event.changes == {"event_types": [["*"], ["job.failed"]], "enabled": [True, False]}

    unknown = submit(admin, url, event_types='["job.exploded"]')
    assert unknown.status_code == 302
    assert any("event_types: unknown event type" in m for m in messages_of(admin.get(url)))
    internal = submit(admin, url, url="http://10.0.0.1/hook")
    assert internal.status_code == 302
    assert any(m.startswith("url:") for m in messages_of(admin.get(url)))
    not_a_list = submit(admin, url, event_types='{"job.failed": 1}')
    assert not_a_list.status_code == 200
    assert "must be a JSON list of event type names" in not_a_list.content.decode()
    endpoint.refresh_from_db()
    assert endpoint.event_types == ["job.failed"] and endpoint.url == receiver.url()
    assert AuditEvent.objects.filter(action="webhook.update").count() == 1


def test_ping_action_queues_a_ping(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url())
    shown = act(login("owner@acme.test"), ENDPOINTS, "ping", [endpoint.pk])
    assert "Queued a ping to 1 endpoint(s)." in shown
    assert WebhookDelivery.objects.get(endpoint=endpoint).event_type == "webhook.ping"
    assert AuditEvent.objects.get(action="webhook.ping").actor_id == world.users["owner"].pk


@pytest.mark.parametrize("who", ["dev@acme.test", "wsadmin@acme.test"])
def test_members_who_do_not_administer_the_org_are_refused(world, receiver, who):
    endpoint, _ = make_endpoint(world, receiver.url())
    client = login(who)
    for url in (ENDPOINTS, f"{ENDPOINTS}{endpoint.pk}/change/", DELIVERIES):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    client.post(f"{ENDPOINTS}{endpoint.pk}/change/", {"url": "http://127.0.0.1:1/", "enabled": ""})
    endpoint.refresh_from_db()
    assert endpoint.url == receiver.url() and endpoint.enabled
