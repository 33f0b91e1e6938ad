"""/metrics answers scrapers only: an address in MANTA_METRICS_ALLOWED_NETWORKS (this host's
loopback by default) or the bearer token MANTA_METRICS_TOKEN. Everyone else gets the API's JSON
error: 401 with WWW-Authenticate: Bearer when a token would let them in, 403 when none is
configured; a wrong token is a 401 from anywhere. The Celery worker's exporter follows the same
rule.

What it reports: the levels the sweep took (jobs by state, why they wait, quotas, GPU-hours),
read from one cache entry, so a scrape runs the same number of queries (none) with 10 jobs or
10,000; and what this process counted as it happened (transitions, requests)."""

import time

import pytest
import requests
from django.db import connection
from django.test import Client
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from audit.context import Actor
from config.worker_metrics import exporter_start, refusal
from jobs import services
from jobs.metrics_snapshot import CACHE_KEY, snapshot_refresh
from jobs.models import Job, JobAttempt, JobState
from tests.factories import (
    JobAttemptFactory,
    JobFactory,
    OrgQuotaFactory,
    ReservationFactory,
    UserFactory,
    WorkspaceFactory,
    WorkspaceQuotaFactory,
)

TOKEN = "s3cret-metrics-token-0123456789"
OUTSIDE = "203.0.113.9"  # TEST-NET-3: never on the default allow-list


def scrape(remote_addr: str = "127.0.0.1", token: str | None = None, **headers):
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return Client().get("/metrics", REMOTE_ADDR=remote_addr, **headers)


def samples(response) -> dict[tuple[str, frozenset], float]:
    """The scrape's samples: (name, labels) → value."""
    return samples_of(response.content.decode())


def samples_of(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict, name: str, **labels) -> float | None:
    return found.get((name, frozenset(labels.items())))


@pytest.fixture(autouse=True)
def no_snapshot():
    """Each test starts before any sweep took the levels."""
    from django.core.cache import cache

    cache.delete(CACHE_KEY)
    yield
    cache.delete(CACHE_KEY)


@pytest.fixture
def token(settings):
    settings.MANTA_METRICS_TOKEN = TOKEN


def assert_scraped(response):
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    found = samples(response)
    assert value(found, "manta_processes") >= 1
    assert value(found, "process_resident_memory_bytes") > 0


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


# --- what a scrape reports --------------------------------------------------------------------


def acme_platform():
    """Acme's ml workspace: a guarantee and a limit, a GPU budget, a running GPU job (with its
    reservation and an hour of running), a queued job the org capacity blocks, one waiting for
    approval, a succeeded one."""
    ml = WorkspaceFactory(organization__slug="acme", slug="ml")
    OrgQuotaFactory(organization=ml.organization, cpu=4, memory_gb=64, gpu=2)
    WorkspaceQuotaFactory(
        workspace=ml, guaranteed_cpu=2, limit_cpu=8, limit_gpu=2, gpu_hours_per_month=100
    )
    running = JobFactory(workspace=ml, state=JobState.RUNNING, requested_cpu=4, requested_gpu=2)
    ReservationFactory(job=running)
    an_hour_ago = time.time() - 3600
    JobAttemptFactory(job=running, running_at=timezone_at(an_hour_ago))
    JobFactory(workspace=ml, state=JobState.QUEUED, requested_cpu=1, requested_gpu=0)
    JobFactory(workspace=ml, state=JobState.PENDING_APPROVAL)
    JobFactory(workspace=ml, state=JobState.SUCCEEDED)
    return ml


def timezone_at(unix: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(unix, tz=dt.UTC)


def test_before_the_first_sweep_no_level_is_reported(db):
    acme_platform()
    found = samples(scrape())
    assert not [key for key in found if key[0] == "manta_jobs"]
    assert value(found, "manta_worker_heartbeat_timestamp_seconds") is None


def test_a_scrape_reports_the_levels_the_sweep_took(db):
    acme_platform()
    before = time.time()
    snapshot_refresh()
    found = samples(scrape())
    tenant = {"organization": "acme", "workspace": "ml"}
    states = {s: value(found, "manta_jobs", **tenant, state=s) for s in JobState.values}
    assert states == {
        "pending_approval": 1,
        "queued": 1,
        "launching": 0,
        "running": 1,
        "preempting": 0,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
        "rejected": 0,
    }
    oldest = value(
        found, "manta_jobs_oldest_state_entered_timestamp_seconds", **tenant, state="running"
    )
    assert before - 60 < oldest <= time.time()
    assert value(found, "manta_pending_jobs", **tenant, reason="approval") == 1
    # 4 CPUs of the org's 4 are held by the running job
    assert value(found, "manta_pending_jobs", **tenant, reason="org_capacity") == 1
    assert value(found, "manta_pending_jobs", **tenant, reason="admission_pass") == 0
    assert value(found, "manta_quota_guaranteed", **tenant, resource="cpu") == 2
    assert value(found, "manta_quota_limit", **tenant, resource="cpu") == 8
    assert value(found, "manta_quota_limit", **tenant, resource="memory_gb") is None  # none set
    assert value(found, "manta_quota_reserved", **tenant, resource="cpu") == 4
    assert value(found, "manta_quota_reserved", **tenant, resource="gpu") == 2
    assert value(found, "manta_org_capacity", organization="acme", resource="gpu") == 2
    assert value(found, "manta_gpu_hours_used", **tenant) == pytest.approx(2.0, abs=0.01)
    assert value(found, "manta_gpu_hours_budget", **tenant) == 100
    assert value(found, "manta_quota_drift", kind="missing_reservations") == 0
    assert value(found, "manta_quota_drift", kind="orphan_reservations") == 0
    assert value(found, "manta_celery_queue_depth", queue="celery") is not None
    assert before <= value(found, "manta_worker_heartbeat_timestamp_seconds") <= time.time()


def test_moves_and_requests_are_counted_as_they_happen(db, django_capture_on_commit_callbacks):
    """Submission and approval in this process: the transition, the approval wait and the HTTP
    request all reach the next scrape (single-process mode: the values live here)."""
    from prometheus_client import REGISTRY

    ml = acme_platform()
    ml.approval_policy = "always"
    ml.save()
    labels = {"organization": "acme", "workspace": "ml"}

    def get(name, **extra):
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0

    moved = {"from_state": "pending_approval", "to_state": "rejected", "kind": "rejected"}
    decided, rejected = (
        get("manta_job_transitions_total", **moved),
        get("manta_approval_wait_seconds_count", decision="rejected"),
    )
    job = JobFactory(workspace=ml, state=JobState.PENDING_APPROVAL)
    admin = UserFactory(in_org=ml.organization, in_org__role="admin")
    with django_capture_on_commit_callbacks(execute=True):  # counted once the move commits
        services.job_reject(actor=Actor.for_user(admin), job=job, reason="too big")
    assert get("manta_job_transitions_total", **moved) == decided + 1
    assert get("manta_approval_wait_seconds_count", decision="rejected") == rejected + 1

    requests = {"method": "GET", "route": "/healthz", "status": "200"}
    before = REGISTRY.get_sample_value("manta_http_requests_total", requests) or 0
    assert Client().get("/healthz").status_code == 200
    assert REGISTRY.get_sample_value("manta_http_requests_total", requests) == before + 1
    found = samples(scrape())
    assert value(found, "manta_http_requests_total", **requests) == before + 1


def bulk_jobs(workspace, count: int) -> None:
    """``count`` jobs in three states, by bulk insert (a template job's fields)."""
    model = JobFactory(workspace=workspace)
    fields = {
        f.attname: getattr(model, f.attname)
        for f in Job._meta.concrete_fields
        if f.attname not in ("id", "state", "created_at", "updated_at")
    }
    states = [JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED]
    Job.objects.bulk_create(
        (Job(**fields, state=states[i % 3]) for i in range(count - 1)), batch_size=2000
    )


class QueryCount:
    """Every statement this connection runs inside the block (a wrapper, not the debug log,
    which keeps only the last 9,000)."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)

    def __enter__(self):
        self._wrapped = connection.execute_wrapper(self)
        self._wrapped.__enter__()
        return self

    def __exit__(self, *exc):
        return self._wrapped.__exit__(*exc)


def scrape_cost(workspace, jobs: int) -> tuple[int, float, int, float]:
    """(queries and ms of a sweep's refresh, queries and ms of a scrape) with ``jobs``."""
    Job.objects.all().delete()
    bulk_jobs(workspace, jobs)
    assert Job.objects.count() == jobs
    with QueryCount() as refresh:
        started = time.perf_counter()
        snapshot_refresh()
        refresh_ms = (time.perf_counter() - started) * 1000
    scrape()  # warm: the first scrape imports and builds what later ones reuse
    with QueryCount() as scraping:
        started = time.perf_counter()
        response = scrape()
        elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code == 200
    found = samples(response)
    tenant = {"organization": "acme", "workspace": "ml"}
    counted = sum(value(found, "manta_jobs", **tenant, state=s) for s in JobState.values)
    assert counted == jobs
    return refresh.count, round(refresh_ms, 1), scraping.count, round(elapsed, 1)


def test_a_scrape_costs_the_same_queries_with_10_or_10000_jobs(db):
    """docs/observability.md quotes the figures this prints (pytest -s)."""
    ml = acme_platform()
    JobAttempt.objects.all().delete()
    small = scrape_cost(ml, 10)
    large = scrape_cost(ml, 10_000)
    print(f"\n(refresh queries, refresh ms, scrape queries, scrape ms): 10 jobs {small}, "
          f"10,000 jobs {large}")  # fmt: skip
    assert small[2] == large[2] == 0  # the scrape reads one cache key, no SQL
    assert small[0] == large[0]  # and the sweep's refresh is a fixed number of aggregates


@pytest.fixture
def exporter():
    """The worker's exporter, as a worker starts it, on a free loopback port of this process
    (whose families it then serves)."""
    server = exporter_start("127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_worker_exporter_answers_scrapers_only(exporter, settings):
    """Over HTTP, the same rule and answers as /metrics: loopback by default, then the token
    only once loopback is off the list."""
    response = requests.get(f"{exporter}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    found = samples_of(response.text)
    assert value(found, "manta_processes") == 1  # this process: no multiprocess folder here
    assert value(found, "process_resident_memory_bytes") > 0
    assert requests.get(f"{exporter}/other", timeout=10).status_code == 404

    settings.MANTA_METRICS_ALLOWED_NETWORKS = ["192.0.2.0/24"]
    refused = requests.get(f"{exporter}/metrics", timeout=10)
    assert (refused.status_code, refused.json()["type"]) == (403, "permission_denied")
    assert "WWW-Authenticate" not in refused.headers
    settings.MANTA_METRICS_TOKEN = TOKEN
    refused = requests.get(f"{exporter}/metrics", timeout=10)
    assert (refused.status_code, refused.json()["type"]) == (401, "not_authenticated")
    assert refused.headers["WWW-Authenticate"] == "Bearer"
    assert "manta_processes" not in refused.text
    wrong = requests.get(
        f"{exporter}/metrics", headers={"Authorization": f"Bearer {TOKEN}x"}, timeout=10
    )
    assert (wrong.status_code, wrong.json()["type"]) == (401, "authentication_failed")
    right = requests.get(
        f"{exporter}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert right.status_code == 200 and "manta_processes" in right.text


def test_the_exporters_rule_matches_the_apis(settings):
    settings.MANTA_METRICS_TOKEN = ""
    assert refusal("127.0.0.1", "") is None
    assert refusal("::ffff:127.0.0.1", "") is None
    assert refusal(OUTSIDE, "")[:2] == (403, "permission_denied")
    assert refusal(OUTSIDE, f"Bearer {TOKEN}")[:2] == (403, "authentication_failed")
    settings.MANTA_METRICS_TOKEN = TOKEN
    assert refusal(OUTSIDE, "")[:2] == (401, "not_authenticated")
    assert refusal(OUTSIDE, f"Bearer {TOKEN}") is None
    assert refusal("127.0.0.1", f"Bearer {TOKEN}x")[:2] == (401, "authentication_failed")


def test_warm_pools_report_their_levels_and_count_hits_and_misses(
    db, django_capture_on_commit_callbacks
):
    from jobs import pools
    from tests.factories import JobAttemptFactory as Attempts
    from tests.factories import WarmClusterFactory, WarmPoolFactory

    pool = WarmPoolFactory(organization__slug="acme", size=2)
    WarmClusterFactory(pool=pool)
    WarmClusterFactory(pool=pool, state="starting", ready_at=None)
    labels = {"organization": "acme", "target": "local", "pool": str(pool.pk)}
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(2):  # the first takes the idle cluster, the second finds none
            pools.pool_claim(pool=pool, attempt=Attempts(job__organization=pool.organization))
    snapshot_refresh()
    found = samples(scrape())
    assert value(found, "manta_warm_pool_size", **labels) == 2
    assert value(found, "manta_warm_pool_clusters", **labels, state="claimed") == 1
    assert value(found, "manta_warm_pool_clusters", **labels, state="starting") == 1
    assert value(found, "manta_warm_pool_clusters", **labels, state="idle") == 0
    assert value(found, "manta_warm_pool_claims_total", **labels, result="hit") >= 1
    assert value(found, "manta_warm_pool_claims_total", **labels, result="miss") >= 1
