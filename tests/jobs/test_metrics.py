"""/metrics answers scrapers only: an address in MANTA_METRICS_ALLOWED_NETWORKS (this host's
loopback by default) or the bearer token MANTA_METRICS_TOKEN. Everyone else gets the API's JSON
error: 401 with WWW-Authenticate: Bearer when a token would let them in, 403 when none is
configured; a wrong token is a 401 from anywhere."""

import pytest
from django.test import Client
from prometheus_client import CONTENT_TYPE_LATEST

from jobs.accounting import reconcile
from jobs.models import JobState

TOKEN = "s3cret-metrics-token-0123456789"
OUTSIDE = "203.0.113.9"  # TEST-NET-3: never on the default allow-list


def scrape(remote_addr: str = "127.0.0.1", token: str | None = None, **headers):
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return Client().get("/metrics", REMOTE_ADDR=remote_addr, **headers)


def expected_body() -> str:
    """The Prometheus text of an empty platform, as /metrics always wrote it."""
    lines = ["# HELP manta_jobs Jobs by state", "# TYPE manta_jobs gauge"]
    lines += [f'manta_jobs{{state="{state}"}} 0.0' for state in JobState.values]
    lines += [
        "# HELP manta_quota_drift Admission invariants that do not hold (0 = healthy)",
        "# TYPE manta_quota_drift gauge",
    ]
    lines += [f'manta_quota_drift{{kind="{kind}"}} 0.0' for kind in reconcile()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def token(settings):
    settings.MANTA_METRICS_TOKEN = TOKEN


def assert_scraped(response):
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    assert response.content.decode() == expected_body()


def assert_refused(response, status: int, type_: str):
    assert response.status_code == status, response.content
    body = response.json()
    assert body["type"] == type_ and body["errors"] == {}, body
    assert "manta_jobs" not in response.content.decode()
    if status == 401:
        assert response["WWW-Authenticate"] == "Bearer"
    else:
        assert "WWW-Authenticate" not in response


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"])
def test_this_hosts_loopback_scrapes_with_nothing_configured(db, address):
    assert_scraped(scrape(address))


def test_anyone_else_is_refused_403_when_no_token_is_configured(db):
    assert_refused(scrape(OUTSIDE), 403, "permission_denied")


def test_anyone_else_is_asked_for_the_token_when_one_is_configured(db, token):
    assert_refused(scrape(OUTSIDE), 401, "not_authenticated")


def test_the_token_scrapes_from_anywhere(db, token):
    assert_scraped(scrape(OUTSIDE, token=TOKEN))
    assert_scraped(scrape("2001:db8::7", token=TOKEN))


@pytest.mark.parametrize("address", [OUTSIDE, "127.0.0.1"])
@pytest.mark.parametrize(
    "authorization",
    [
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        "Bearer ",
        f"Token {TOKEN}",
        "Basic cHJvbWV0aGV1czpzM2NyZXQ=",
    ],
)
def test_a_wrong_token_is_401_even_from_an_allowed_network(db, token, address, authorization):
    response = Client().get("/metrics", REMOTE_ADDR=address, HTTP_AUTHORIZATION=authorization)
    assert_refused(response, 401, "authentication_failed")


def test_without_a_configured_token_no_bearer_token_lets_anyone_in(db):
    assert_refused(scrape(OUTSIDE, token=""), 403, "authentication_failed")
    assert_refused(scrape(OUTSIDE, token=TOKEN), 403, "authentication_failed")


def test_a_listed_network_scrapes_and_an_empty_list_leaves_only_the_token(db, settings, token):
    settings.MANTA_METRICS_ALLOWED_NETWORKS = ["10.20.0.0/16", "2001:db8::/32"]
    assert_scraped(scrape("10.20.30.40"))
    assert_scraped(scrape("2001:db8::7"))
    assert_refused(scrape("10.21.0.1"), 401, "not_authenticated")
    assert_refused(scrape("127.0.0.1"), 401, "not_authenticated")
    settings.MANTA_METRICS_ALLOWED_NETWORKS = []
    assert_refused(scrape("127.0.0.1"), 401, "not_authenticated")
    assert_scraped(scrape("127.0.0.1", token=TOKEN))


def test_x_forwarded_for_is_ignored_without_proxies(db):
    """Any client can write the header: with MANTA_NUM_PROXIES=0 only REMOTE_ADDR counts."""
    assert_refused(scrape(OUTSIDE, HTTP_X_FORWARDED_FOR="127.0.0.1"), 403, "permission_denied")


def test_behind_a_proxy_the_client_is_what_the_proxy_recorded(db, settings):
    """A reverse proxy on this host: every request comes from loopback, and the client is the
    address the proxy appended to X-Forwarded-For (MANTA_NUM_PROXIES=1)."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    outside = scrape("127.0.0.1", HTTP_X_FORWARDED_FOR=f"127.0.0.1, {OUTSIDE}")
    assert_refused(outside, 403, "permission_denied")
    assert_scraped(scrape("127.0.0.1", HTTP_X_FORWARDED_FOR="127.0.0.1"))


def test_a_refusal_is_json_whatever_the_scraper_accepts(db, token):
    for accept in ("text/plain;version=0.0.4", "application/openmetrics-text;version=1.0.0"):
        assert_refused(scrape(OUTSIDE, HTTP_ACCEPT=accept), 401, "not_authenticated")
        assert_scraped(scrape(OUTSIDE, token=TOKEN, HTTP_ACCEPT=accept))


def test_metrics_are_not_in_the_api_schema(db):
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    assert not [path for path in paths if "metrics" in path]
