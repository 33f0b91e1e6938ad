"""Webhook endpoints and deliveries in the admin panel: visible to the admins of their org with
every attempt, changed by nobody (writes go through the API's services), hidden from others."""

from django.test import Client

from notifications.models import WebhookDelivery
from tests.conftest import PASSWORD

from .conftest import emit, make_endpoint, pump


def login(email):
    client = Client()
    assert client.login(email=email, password=PASSWORD)
    return client


def test_deliveries_are_shown_read_only_to_their_org_admins(world, receiver):
    endpoint, _ = make_endpoint(world, receiver.url("/hooks"))
    receiver.replies = [(500, {}, b"boom"), (200, {}, b"ok")]
    emit(world)
    pump()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    admin = login("admin@acme.test")
    pages = [
        f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/",
        f"/admin/notifications/webhookdelivery/{delivery.pk}/change/",
    ]
    for url in pages:
        page = admin.get(url)
        assert page.status_code == 200, url
        assert 'name="_save"' not in page.content.decode()
        assert admin.post(url, {"enabled": "off"}).status_code == 403
    attempts = admin.get(pages[1]).content.decode()
    assert "boom" in attempts and "500" in attempts  # the failed attempt, then the success
    assert admin.get("/admin/notifications/webhookendpoint/add/").status_code == 403
    own_listing = admin.get("/admin/notifications/webhookdelivery/").content.decode()
    assert pages[1] in own_listing
    foreign = login("owner@globex.test")
    assert foreign.get(pages[0]).status_code in (302, 404)
    listing = foreign.get("/admin/notifications/webhookdelivery/")
    assert listing.status_code == 200  # globex's owner administers globex, not acme
    assert pages[1] not in listing.content.decode()
