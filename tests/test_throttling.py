"""Throttles (config/throttles.py): logins per address and per account, token issuance per account,
job submissions per user and per workspace, package uploads per user; 429 ``throttled`` with
Retry-After; the counts live in the shared cache. Each test sets low rates of its own, a fresh
local-memory cache (one test a real Redis) and a clock it moves by hand."""

from __future__ import annotations

import io
import logging
import multiprocessing
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import redis
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from config import throttles
from config.throttles import RateThrottle, client_address, parse_rate
from tests.conftest import PASSWORD
from tests.factories import JobTemplateFactory, WorkspaceFactory, WorkspaceMembershipFactory

ROOT = Path(__file__).resolve().parents[1]
TOKENS = "/api/v1/auth/tokens/"
WS = "/api/v1/orgs/acme/workspaces/ml/"
WS2 = "/api/v1/orgs/acme/workspaces/ml2/"
SCOPES = (
    "login_ip",
    "login_account",
    "tokens",
    "submit_user",
    "submit_workspace",
    "package_upload",
)
TEST_REDIS = "redis://127.0.0.1:6379/13"


class Clock:
    def __init__(self, now: float):
        self.now = now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def local_cache(settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "throttle-tests",
        }
    }
    cache.clear()


@pytest.fixture
def clock(monkeypatch):
    import time

    clock = Clock(time.time())
    monkeypatch.setattr(RateThrottle, "timer", lambda self: clock.now)
    return clock


@pytest.fixture
def rates(settings):
    """Set throttle rates (scope=rate; the others generous) and other REST_FRAMEWORK keys."""

    def set_rates(num_proxies: int = 0, **scoped: str) -> None:
        settings.REST_FRAMEWORK = {
            **settings.REST_FRAMEWORK,
            "DEFAULT_THROTTLE_RATES": {**dict.fromkeys(SCOPES, "1000/min"), **scoped},
            "NUM_PROXIES": num_proxies,
        }

    return set_rates


def login(email="dev@acme.test", password="wrong", ip="10.0.0.1", **extra):
    return APIClient().post(
        TOKENS, {"email": email, "password": password}, format="json", REMOTE_ADDR=ip, **extra
    )


def assert_throttled(response, retry_after: int | None = None) -> None:
    assert response.status_code == 429, response.content
    body = response.json()
    assert body["type"] == "throttled" and body["errors"] == {}
    assert "throttled" in body["detail"]
    wait = int(response["Retry-After"])
    assert 1 <= wait <= (retry_after or wait)
    if retry_after is not None:
        assert wait == retry_after and f"{retry_after} seconds" in body["detail"]


# --- logins -----------------------------------------------------------------------------------


def test_sixth_wrong_password_is_429_and_so_is_the_right_one_until_the_window_passes(
    world, rates, clock
):
    rates(login_account="5/min")
    for _ in range(5):
        assert login().status_code == 401
    assert_throttled(login(), retry_after=60)
    clock.advance(20)
    assert_throttled(login(password=PASSWORD), retry_after=40)  # the right password too
    clock.advance(40)
    assert login(password=PASSWORD).status_code == 201


def test_another_account_from_the_same_address_meets_the_address_limit(world, rates, clock):
    rates(login_ip="8/min", login_account="5/min")
    for _ in range(5):
        assert login().status_code == 401
    assert_throttled(login())  # the account's limit; the address has used 6 of 8
    for _ in range(2):
        assert login("dev2@acme.test").status_code == 401
    assert_throttled(login("dev2@acme.test", password=PASSWORD), retry_after=60)
    # the address is what is limited, not dev2's account
    assert login("dev2@acme.test", password=PASSWORD, ip="10.0.0.2").status_code == 201


def test_an_account_is_limited_from_every_address(world, rates, clock):
    rates(login_account="5/min")
    for n in range(5):
        assert login(ip=f"10.0.1.{n}").status_code == 401
    # the same account however it is written, from a sixth address
    assert_throttled(login(" DEV@Acme.TEST ", password=PASSWORD, ip="10.0.1.5"))
    assert login("dev2@acme.test", password=PASSWORD, ip="10.0.1.5").status_code == 201


def test_an_address_over_its_limit_does_not_use_up_the_account(world, rates, clock):
    rates(login_ip="2/min", login_account="4/min")
    for _ in range(2):
        assert login().status_code == 401
    for _ in range(10):
        assert_throttled(login())
    # the account has counted 2 attempts, not 12: two more are let through
    assert login(ip="10.0.0.2").status_code == 401
    assert login(password=PASSWORD, ip="10.0.0.3").status_code == 201


def test_x_forwarded_for_counts_only_behind_the_configured_proxies(world, rates, clock):
    rates(login_ip="3/min")
    for n in range(3):
        assert login(HTTP_X_FORWARDED_FOR=f"192.0.2.{n}").status_code == 401
    assert_throttled(login(HTTP_X_FORWARDED_FOR="192.0.2.9"))  # a client cannot choose its own

    cache.clear()
    rates(login_ip="3/min", num_proxies=1)  # one proxy, which appends the address it saw
    for n in range(6):
        forwarded = f"198.51.100.77, 192.0.2.{n}"
        assert login(f"u{n}@acme.test", HTTP_X_FORWARDED_FOR=forwarded).status_code == 401
    for _ in range(3):
        login(HTTP_X_FORWARDED_FOR="198.51.100.77, 192.0.2.50")
    assert_throttled(login("x@acme.test", HTTP_X_FORWARDED_FOR="203.0.113.1, 192.0.2.50"))


def test_a_lowered_rate_still_tells_when_to_come_back(world, rates, clock):
    rates(login_account="5/min")
    for _ in range(4):
        assert login().status_code == 401
    clock.advance(10)
    rates(login_account="2/min")  # the history holds more than the new rate allows
    assert_throttled(login(), retry_after=50)


@pytest.mark.parametrize("form", ["/admin/login/", "/api-auth/login/"])
def test_the_browser_sign_in_forms_share_the_login_limits(world, rates, clock, form):
    """The admin's form and the one that opens a job's Ray Dashboard count against the same
    account and address as the token endpoint: five wrong passwords in all, not five per form."""
    rates(login_account="5/min")
    world.users["developer"].is_staff = True  # the admin's form signs in staff only
    world.users["developer"].save(update_fields=["is_staff"])
    browser = Client()
    for _ in range(3):
        assert login().status_code == 401
    for _ in range(2):  # a wrong password: the form again, no session
        wrong = browser.post(form, {"username": "dev@acme.test", "password": "wrong"})
        assert wrong.status_code == 200 and "_auth_user_id" not in browser.session
    refused = browser.post(form, {"username": "DEV@acme.test", "password": PASSWORD})
    assert refused.status_code == 429 and refused["Retry-After"] == "60"
    assert b"try again in 60 seconds" in refused.content
    assert "_auth_user_id" not in browser.session  # the right password too, until it passes
    assert_throttled(login(password=PASSWORD))
    assert browser.get(form).status_code == 200  # showing the form is not an attempt
    clock.advance(60)
    signed_in = browser.post(form, {"username": "dev@acme.test", "password": PASSWORD})
    assert signed_in.status_code == 302 and "_auth_user_id" in browser.session


def test_an_ipv6_client_is_counted_by_its_64():
    assert client_address("2001:db8:1:2:aaaa::1") == client_address("2001:db8:1:2:bbbb::2")
    assert client_address("2001:db8:1:2::1") != client_address("2001:db8:1:3::1")
    assert client_address("::ffff:192.0.2.1") == client_address("192.0.2.1") == "192.0.2.1"
    assert client_address("not an address") == client_address("not an address")


def test_tokens_per_user_over_the_longer_window(world, rates, clock):
    rates(tokens="2/h")
    for _ in range(2):
        assert login(password=PASSWORD).status_code == 201
    assert_throttled(login(password=PASSWORD, ip="10.0.0.2"), retry_after=3600)
    assert login("dev2@acme.test", password=PASSWORD).status_code == 201


def test_only_issuing_a_token_is_throttled(world, rates, clock):
    rates(login_ip="1/min", login_account="1/min", tokens="1/min")
    assert login(password=PASSWORD).status_code == 201
    client = world.client("developer")
    for _ in range(3):
        assert client.get(TOKENS).status_code == 200
        assert client.get("/api/v1/me/").status_code == 200


def test_an_unreadable_body_is_400_not_a_crash(world, rates, clock):
    rates(login_account="1/min")
    client = APIClient()
    response = client.post(TOKENS, "[1, 2]", content_type="application/json")
    assert response.status_code == 400
    response = client.post(TOKENS, {"email": 5, "password": "x"}, format="json")
    assert response.status_code == 400


# --- job submission ---------------------------------------------------------------------------


@pytest.fixture
def second_workspace(world, template):
    """ml2 in acme, where the developer may submit too; a template in each workspace."""
    ws2 = WorkspaceFactory(organization=world.org, slug="ml2")
    WorkspaceMembershipFactory(workspace=ws2, user=world.users["developer"], role="developer")
    return {WS: template.pk, WS2: JobTemplateFactory(workspace=ws2, name="counter").pk}


def submit(world, who, ws=WS, templates=None):
    body = {"template": templates[ws]}
    return world.client(who).post(ws + "jobs/", body, format="json")


def test_submission_per_user(world, second_workspace, rates, clock):
    rates(submit_user="3/min")
    for ws in (WS, WS2, WS):  # the user's submissions over all workspaces
        assert submit(world, "developer", ws, second_workspace).status_code == 201
    assert_throttled(submit(world, "developer", WS2, second_workspace), retry_after=60)
    assert submit(world, "developer2", WS, second_workspace).status_code == 201
    clock.advance(60)
    assert submit(world, "developer", WS, second_workspace).status_code == 201


def test_submission_per_workspace(world, second_workspace, rates, clock):
    rates(submit_workspace="3/min")
    for who in ("developer", "developer2", "developer"):
        assert submit(world, who, WS, second_workspace).status_code == 201
    clock.advance(15)
    assert_throttled(submit(world, "developer2", WS, second_workspace), retry_after=45)
    assert submit(world, "developer", WS2, second_workspace).status_code == 201


def test_a_user_over_their_limit_does_not_use_up_the_workspace(
    world, second_workspace, rates, clock
):
    rates(submit_user="2/min", submit_workspace="4/min")
    for _ in range(2):
        assert submit(world, "developer", WS, second_workspace).status_code == 201
    for _ in range(5):
        assert_throttled(submit(world, "developer", WS, second_workspace))
    for _ in range(2):  # the workspace has counted 2 submissions, not 7
        assert submit(world, "developer2", WS, second_workspace).status_code == 201


def test_requests_the_workspace_refuses_anyway_count_against_no_one(
    world, second_workspace, rates, clock
):
    rates(submit_user="2/min", submit_workspace="2/min")
    for who, status in [("foreign", 404), ("viewer", 403)]:
        for _ in range(4):
            assert submit(world, who, WS, second_workspace).status_code == status
    assert world.client(None).post(WS + "jobs/", {}, format="json").status_code == 401
    for who in ("developer", "developer2"):
        assert submit(world, who, WS, second_workspace).status_code == 201


def test_a_rejected_submission_counts(world, rates, clock):
    # the throttle runs before the handler: input it refuses (400) was still a submission
    rates(submit_user="2/min")
    client = world.client("developer")
    for _ in range(2):
        assert client.post(WS + "jobs/", {}, format="json").status_code == 400
    assert_throttled(client.post(WS + "jobs/", {}, format="json"))


# --- package uploads --------------------------------------------------------------------------


def a_zip(n: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(zipfile.ZipInfo("train.py", (2024, 1, 1, 0, 0, 0)), f"print({n})\n")
    return buffer.getvalue()


def upload(world, who, n, ws=WS):
    body = a_zip(n)
    return world.client(who).post(ws + "packages/", data=body, content_type="application/zip")


def test_a_burst_of_package_uploads_is_429_past_the_rate(
    world, second_workspace, rates, clock, package_storage
):
    rates(package_upload="3/h")
    for n, ws in enumerate((WS, WS2, WS)):
        assert upload(world, "developer", n, ws).status_code == 201
    # The user's uploads over all workspaces count; content the workspace holds already too.
    assert_throttled(upload(world, "developer", 3, WS2), retry_after=3600)
    assert_throttled(upload(world, "developer", 2, WS), retry_after=3600)
    assert upload(world, "developer2", 4).status_code == 201  # another user counts alone
    clock.advance(3600)
    assert upload(world, "developer", 5).status_code == 201


# --- the shared cache -------------------------------------------------------------------------


@pytest.fixture
def redis_cache(settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": TEST_REDIS,
            "KEY_PREFIX": "manta-throttle-test",
        }
    }
    client = redis.Redis.from_url(TEST_REDIS)
    stale = list(client.scan_iter("manta-throttle-test:*"))
    if stale:
        client.delete(*stale)
    yield client
    left = list(client.scan_iter("manta-throttle-test:*"))
    if left:
        client.delete(*left)


def test_the_counts_live_in_the_shared_redis(world, rates, clock, redis_cache):
    rates(login_account="2/min")
    for _ in range(2):
        assert login().status_code == 401
    key = throttles.LoginAccountThrottle().cache_format % {
        "scope": "login_account",
        "ident": throttles.digest("dev@acme.test"),
    }
    stored = cache.make_and_validate_key(key) + throttles.REDIS_KEY_SUFFIX
    assert redis_cache.exists(stored)
    assert 0 < redis_cache.ttl(stored) <= 60
    assert [float(t) for t in redis_cache.lrange(stored, 0, -1)] == [clock.now] * 2
    # another process (a second gunicorn worker) sees the same count
    cache.close()
    assert_throttled(login(password=PASSWORD))


def test_a_cache_outage_lets_requests_through(world, rates, clock, settings, caplog):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:9/0",  # nothing listens on the discard port
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
    rates(login_account="1/min")
    with caplog.at_level(logging.WARNING, logger="config.throttles"):
        assert login().status_code == 401
        assert login(password=PASSWORD).status_code == 201
    assert "cache unavailable" in caplog.text


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "parsed"),
    [("10/min", (10, 60)), ("500/30m", (500, 1800)), ("5/s", (5, 1)), ("100/day", (100, 86400))],
)
def test_rates_take_a_multiple_of_a_period(rate, parsed):
    assert parse_rate(rate) == parsed


def load_settings(**env: str) -> subprocess.CompletedProcess:
    code = (
        "import config.settings as s; "
        "print(s.REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'], s.REST_FRAMEWORK['NUM_PROXIES']); "
        "print(s.CACHES['default']['BACKEND'], s.CACHES['default']['LOCATION'])"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MANTA_VAR_DIR": "/tmp/manta-settings-check", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("value", ["ten/min", "0/min", "5/fortnight", "5/0m", "5"])
def test_a_bad_rate_stops_the_process_naming_it(value):
    result = load_settings(MANTA_THROTTLE_SUBMIT_USER=value)
    assert result.returncode != 0
    assert "MANTA_THROTTLE_SUBMIT_USER: a rate such as" in result.stderr


def test_settings_defaults_and_the_cache_they_pick():
    embedded = load_settings()
    assert embedded.returncode == 0, embedded.stderr
    rates_line, cache_line = embedded.stdout.splitlines()
    assert "'submit_user': '500/30m'" in rates_line and rates_line.endswith(" 0")
    assert cache_line == "django.core.cache.backends.filebased.FileBasedCache " + (
        "/tmp/manta-settings-check/cache"
    )
    for value in ("500/30m", "10/min", "2/hour"):
        assert parse_rate(value)  # what the settings accept, the throttles read
    broker = load_settings(CELERY_BROKER_URL="redis://redis:6379/0", MANTA_THROTTLE_TOKENS="")
    assert broker.returncode == 0, broker.stderr
    rates_line, cache_line = broker.stdout.splitlines()
    assert "'tokens': None" in rates_line
    assert cache_line == "django.core.cache.backends.redis.RedisCache redis://redis:6379/0"
    own = load_settings(
        CELERY_BROKER_URL="redis://redis:6379/0", MANTA_CACHE_URL="redis://cache:6379/2"
    )
    assert own.stdout.splitlines()[1].endswith("redis://cache:6379/2")


@pytest.fixture
def file_cache(settings, tmp_path):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(tmp_path / "cache"),
        }
    }


@pytest.mark.parametrize("backend", ["redis_cache", "file_cache"])
def test_concurrent_requests_never_slip_past_the_limit(rates, backend, request):
    """Eight clients at once, five requests each, against a limit of ten: exactly ten pass.
    (Unlocked, each would count against the history it read, and more would pass.)"""
    request.getfixturevalue(backend)
    rates(login_ip="10/min")
    from django.test import RequestFactory

    factory = RequestFactory()
    start = threading.Barrier(8)
    allowed = []

    def client() -> None:
        start.wait()
        for _ in range(5):
            incoming = factory.post(TOKENS, REMOTE_ADDR="198.51.100.7")
            allowed.append(throttles.LoginIPThrottle().allow_request(incoming, None))

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 10, allowed.count(True)


def _five_requests(start, allowed) -> None:
    """One API process: five login attempts from one address, once every process is ready."""
    from django.test import RequestFactory

    start.wait()
    for _ in range(5):
        incoming = RequestFactory().post(TOKENS, REMOTE_ADDR="198.51.100.7")
        if throttles.LoginIPThrottle().allow_request(incoming, None):
            with allowed.get_lock():
                allowed.value += 1


@pytest.mark.parametrize("backend", ["redis_cache", "file_cache"])
def test_concurrent_processes_never_slip_past_the_limit(rates, backend, request):
    """Four processes at once (the API's gunicorn workers), five requests each, against a limit
    of ten: exactly ten pass. Each process has its own thread lock: only the cache's own
    atomicity (Redis's script, the file cache's flock) keeps them from counting against
    histories they read at the same time."""
    request.getfixturevalue(backend)
    rates(login_ip="10/min")
    cache.close()  # each child opens its own connection
    fork = multiprocessing.get_context("fork")
    start, allowed = fork.Barrier(4), fork.Value("i", 0)
    children = [fork.Process(target=_five_requests, args=(start, allowed)) for _ in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert allowed.value == 10
