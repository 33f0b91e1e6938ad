"""The SSRF guard: internal addresses are refused when an endpoint is saved (400 naming ``url``
and the rule) and again at delivery time (DNS can change in between)."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from config import ssrf as guard
from notifications import ssrf
from notifications.models import WebhookAttempt, WebhookDelivery

from .conftest import emit, make_endpoint, pump

HOOKS = "/api/v1/orgs/acme/workspaces/ml/webhooks/"


@pytest.fixture
def resolver(monkeypatch):
    """Answer DNS for names of our own: ``{"name": ["1.2.3.4", …]}``."""
    answers: dict[str, list[str]] = {}
    real = guard.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host in answers:
            family = {4: socket.AF_INET, 6: socket.AF_INET6}
            return [
                (family[ipaddress.ip_address(a).version], socket.SOCK_STREAM, 6, "", (a, port))
                for a in answers[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(guard, "getaddrinfo", fake)
    return answers


# Shared with the compute target tests: every internal address kind and how it is named.
INTERNAL_ADDRESSES = [
    ("127.0.0.1", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "metadata"),
    ("169.254.10.1", "link-local"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("224.0.0.1", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("240.0.0.1", "reserved"),
    ("::1", "loopback"),
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),
    ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:169.254.169.254", "metadata"),
    ("64:ff9b::a00:1", "private"),
]


@pytest.mark.parametrize(("address", "rule"), INTERNAL_ADDRESSES)
def test_internal_addresses_are_refused(settings, address, rule):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    assert rule in ssrf.refusal(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(settings, address):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    assert ssrf.refusal(ipaddress.ip_address(address)) is None


def test_allowed_networks_open_exactly_what_they_list(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert ssrf.refusal(ipaddress.ip_address("127.0.0.5")) is None
    assert ssrf.refusal(ipaddress.ip_address("::ffff:127.0.0.5")) is None
    assert ssrf.refusal(ipaddress.ip_address("169.254.169.254"))
    assert ssrf.refusal(ipaddress.ip_address("::1"))


def test_scheme_credentials_and_http(settings):
    settings.WEBHOOK_ALLOW_HTTP = False
    with pytest.raises(ssrf.UnsafeURL, match="http://"):
        ssrf.check_url("http://127.0.0.1/")
    with pytest.raises(ssrf.UnsafeURL, match="https://"):
        ssrf.check_url("ftp://127.0.0.1/")
    with pytest.raises(ssrf.UnsafeURL, match="credentials"):
        ssrf.check_url("https://u:p@127.0.0.1/")
    dest = ssrf.check_url("https://127.0.0.1:8443/a/b?c=d")
    assert (dest.address, dest.port, dest.target, dest.host_header) == (
        "127.0.0.1",
        8443,
        "/a/b?c=d",
        "127.0.0.1:8443",
    )


def refused_at_creation(world, url):
    response = world.client("ws_admin").post(HOOKS, {"url": url}, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["type"] == "validation_error" and list(body["errors"]) == ["url"]
    return body["errors"]["url"][0]


def test_hostname_resolving_to_loopback_is_refused_without_the_setting(world, settings, resolver):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    resolver["hooks.acme.test"] = ["127.0.0.1"]
    message = refused_at_creation(world, "http://hooks.acme.test:8080/hook")
    assert "resolves to 127.0.0.1" in message and "loopback" in message
    assert "loopback" in refused_at_creation(world, "http://localhost/hook")


def test_one_bad_address_among_several_is_enough(world, settings, resolver):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    resolver["mixed.acme.test"] = ["8.8.8.8", "10.0.0.7"]
    assert "10.0.0.7" in refused_at_creation(world, "https://mixed.acme.test/")


def test_metadata_address_is_refused(world, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    message = refused_at_creation(world, "http://169.254.169.254/latest/meta-data/")
    assert "metadata" in message
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the test setting does not open it
    assert "metadata" in refused_at_creation(world, "http://169.254.169.254/latest/meta-data/")


def test_http_refused_unless_allowed(world, settings):
    settings.WEBHOOK_ALLOW_HTTP = False
    assert "https" in refused_at_creation(world, "http://127.0.0.1:9/")


def test_unresolvable_host_is_refused(world, resolver):
    assert "does not resolve" in refused_at_creation(world, "https://no-such-host.invalid/")


def test_with_the_setting_a_name_resolving_to_loopback_is_delivered_to_that_address(
    world, receiver, resolver
):
    resolver["hooks.acme.test"] = ["127.0.0.1"]
    make_endpoint(world, f"http://hooks.acme.test:{receiver.port}/hook")
    emit(world)
    pump()
    [request] = receiver.requests
    assert request.headers["host"] == f"hooks.acme.test:{receiver.port}"


def test_rebinding_to_an_internal_address_is_refused_at_delivery_time(
    world, receiver, resolver, settings
):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 3600]
    resolver["hooks.acme.test"] = ["127.0.0.1"]
    endpoint, _ = make_endpoint(world, f"http://hooks.acme.test:{receiver.port}/hook")
    resolver["hooks.acme.test"] = ["169.254.169.254"]  # the DNS answer changed since
    emit(world)
    pump()
    assert receiver.requests == []
    attempt = WebhookAttempt.objects.get(delivery__endpoint=endpoint)
    assert attempt.status_code is None and "metadata" in attempt.error
    assert WebhookDelivery.objects.get(endpoint=endpoint).state == "pending"  # retried later


def test_setting_removed_after_creation_refuses_at_delivery_time(world, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = [0, 3600]
    endpoint, _ = make_endpoint(world, receiver.url())
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    emit(world)
    pump()
    assert receiver.requests == []
    assert "loopback" in WebhookAttempt.objects.get(delivery__endpoint=endpoint).error
