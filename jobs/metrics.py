"""``/metrics`` in the Prometheus text format: what this API's processes counted as it happened
(requests, submissions, approvals: ``config/metrics.py``), their process metrics, and the levels
the sweep last took from the database (jobs by state, why queued jobs wait, quotas, reservations,
GPU-hours and budgets, the admission invariants' drift, the broker's queue:
``jobs/metrics_snapshot.py``). A scrape reads that snapshot from the cache: it runs no SQL, so its
cost does not grow with the jobs. Each Celery worker serves what its own processes counted
(``config/worker_metrics.py``); docs/observability.md says how to scrape both.

For scrapers only (config/settings.py): a client whose address lies in
``MANTA_METRICS_ALLOWED_NETWORKS`` (this host's loopback by default), or one that sends
``MANTA_METRICS_TOKEN`` as a bearer token. Anyone else is refused in the API's error format: 401
with ``WWW-Authenticate: Bearer`` when a token is configured (sending it would do), 403 when none
is. A wrong token is a 401 from any address, so a misconfigured scraper hears of it.

Here, at the top of the apps, because it reads jobs and quotas; the root URLconf
(``config/urls.py``) includes it by name, so ``config`` imports no app.
"""

import hashlib
import hmac
import ipaddress

from django.conf import settings
from django.http import HttpResponse
from django.urls import path
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from config.metrics import scrape_registry
from quotas.models import RESOURCES

from .metrics_snapshot import REASONS, snapshot
from .models import JobState


class MetricsTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <MANTA_METRICS_TOKEN>``; ``request.auth`` is then True. Compared as
    digests in constant time, so neither the token nor its length shows in the timing."""

    def authenticate(self, request):
        header = get_authorization_header(request)
        if not header:
            return None
        scheme, _, secret = header.partition(b" ")
        expected = settings.MANTA_METRICS_TOKEN.encode()
        if scheme.lower() != b"bearer" or not expected or not _same(secret.strip(), expected):
            raise exceptions.AuthenticationFailed("wrong metrics token")
        return None, True

    def authenticate_header(self, request):
        # Without a configured token no credential would do: DRF then answers 403, not 401.
        return "Bearer" if settings.MANTA_METRICS_TOKEN else None


def _same(given: bytes, expected: bytes) -> bool:
    return hmac.compare_digest(hashlib.sha256(given).digest(), hashlib.sha256(expected).digest())


def client_address(request) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The client as the throttles see it: ``REMOTE_ADDR``, or behind ``MANTA_NUM_PROXIES``
    proxies the address the outermost one recorded in X-Forwarded-For."""
    try:
        address = ipaddress.ip_address((BaseThrottle().get_ident(request) or "").strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack listener's view of an IPv4 client
    return address


class ScraperOnly(BasePermission):
    """The token, or an address in ``MANTA_METRICS_ALLOWED_NETWORKS``."""

    def has_permission(self, request, view) -> bool:
        if request.auth is True:
            return True
        address = client_address(request)
        networks = (ipaddress.ip_network(n) for n in settings.MANTA_METRICS_ALLOWED_NETWORKS)
        if address is not None and any(address in network for network in networks):
            return True
        if settings.MANTA_METRICS_TOKEN:
            raise exceptions.NotAuthenticated("/metrics needs the metrics token from this address")
        raise exceptions.PermissionDenied("/metrics does not answer this address")


class PrometheusText(DefaultContentNegotiation):
    """Whatever a scraper accepts (text/plain, OpenMetrics), it gets the Prometheus text format,
    as before; a refusal is rendered as JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class SnapshotCollector:
    """The level gauges, from the sweep's last snapshot (nothing before the first one: then
    ``manta_worker_heartbeat_timestamp_seconds`` is absent, and that alerts)."""

    def collect(self):
        taken = snapshot()
        if taken is None:
            return

        def family(name: str, help_text: str, *extra: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_text, labels=["organization", "workspace", *extra])

        jobs = family("manta_jobs", "Jobs by state", "state")
        since = family(
            "manta_jobs_oldest_state_entered_timestamp_seconds",
            "When the longest-waiting job in a state entered it (waiting states only)",
            "state",
        )
        pending = family("manta_pending_jobs", "Jobs waiting, by why they wait", "reason")
        guaranteed = family("manta_quota_guaranteed", "Workspace guarantee", "resource")
        limit = family("manta_quota_limit", "Workspace limit (where one is set)", "resource")
        reserved = family("manta_quota_reserved", "Held by launching/running jobs", "resource")
        used = family("manta_gpu_hours_used", "GPU-hours used this month")
        budget = family("manta_gpu_hours_budget", "GPU-hours budget per month (where set)")
        flavor_reserved = family(
            "manta_gpu_flavor_reserved", "GPUs of a flavor held by launching/running jobs", "flavor"
        )
        flavor_used = family(
            "manta_gpu_flavor_hours_used", "GPU-hours of a flavor used this month", "flavor"
        )
        flavor_budget = family(
            "manta_gpu_flavor_hours_budget",
            "GPU-hours budget per month of a flavor (where set)",
            "flavor",
        )
        for pk, values in taken["workspaces"].items():  # [organization slug, workspace slug]
            for state in JobState.values:
                count, oldest = taken["jobs"].get(f"{pk}:{state}", (0, None))
                jobs.add_metric([*values, state], count)
                if oldest is not None:
                    since.add_metric([*values, state], oldest)
            for reason in REASONS:
                pending.add_metric([*values, reason], taken["pending"].get(f"{pk}:{reason}", 0))
            quota = taken["quotas"].get(pk, {})
            held = taken["reserved"].get(pk, {})
            for resource in RESOURCES:
                guaranteed.add_metric(
                    [*values, resource], quota.get("guaranteed", {}).get(resource, 0)
                )
                if resource in quota.get("limit", {}):
                    limit.add_metric([*values, resource], quota["limit"][resource])
                reserved.add_metric([*values, resource], held.get(resource, 0.0))
            used.add_metric(values, round(taken["gpu_hours"].get(pk, 0.0), 6))
            if quota.get("gpu_hours_budget") is not None:
                budget.add_metric(values, quota["gpu_hours_budget"])
            # Typed flavors only (the totals count the untyped), each one the workspace held
            # now or used this month: one that is held no more reads 0, not absent.
            flavors_held = taken.get("flavors_reserved", {}).get(pk, {})
            flavors_used = taken.get("flavor_gpu_hours", {}).get(pk, {})
            flavor_budgets = quota.get("flavor_gpu_hours_budget", {})
            for flavor in sorted({*flavors_held, *flavors_used, *flavor_budgets}):
                flavor_reserved.add_metric([*values, flavor], flavors_held.get(flavor, 0.0))
                flavor_used.add_metric([*values, flavor], round(flavors_used.get(flavor, 0.0), 6))
            for flavor, hours in sorted(flavor_budgets.items()):
                flavor_budget.add_metric([*values, flavor], hours)
        yield from (jobs, since, pending, guaranteed, limit, reserved, used, budget)
        yield from (flavor_reserved, flavor_used, flavor_budget)
        capacity = GaugeMetricFamily(
            "manta_org_capacity",
            "Organisation capacity (where set)",
            labels=["organization", "resource"],
        )
        for organization, resources in taken["capacity"].items():
            for resource, value in resources.items():
                capacity.add_metric([organization, resource], value)
        yield capacity
        yield from _group_families(taken.get("groups", {}))
        drift = GaugeMetricFamily(
            "manta_quota_drift",
            "Admission invariants that do not hold (0 = healthy)",
            labels=["kind"],
        )
        for kind, value in taken["drift"].items():
            drift.add_metric([kind], value)
        yield drift
        depth = GaugeMetricFamily(
            "manta_celery_queue_depth", "Tasks waiting in the broker", labels=["queue"]
        )
        for queue, value in taken["queue_depth"].items():
            depth.add_metric([queue], value)
        yield depth
        yield from _warm_pool_families(taken.get("warm_pools") or {})
        yield GaugeMetricFamily(
            "manta_worker_heartbeat_timestamp_seconds",
            "When a worker's sweep last took these levels",
            value=taken["taken_at"],
        )


def _warm_pool_families(pools: dict[str, dict]) -> list[GaugeMetricFamily]:
    labels = ["organization", "target", "pool"]
    size = GaugeMetricFamily("manta_warm_pool_size", "Warm clusters a pool keeps", labels=labels)
    clusters = GaugeMetricFamily(
        "manta_warm_pool_clusters", "A warm pool's clusters by state", labels=[*labels, "state"]
    )
    age = GaugeMetricFamily(
        "manta_warm_pool_oldest_idle_seconds",
        "How long a pool's oldest idle cluster has waited (0: none idle)",
        labels=labels,
    )
    for pk, level in pools.items():
        names = [*level["labels"], pk]
        size.add_metric(names, level["size"])
        for state, count in level["clusters"].items():
            clusters.add_metric([*names, state], count)
        age.add_metric(names, level["oldest_idle_seconds"])
    return [size, clusters, age]


class MetricsView(APIView):
    authentication_classes = [MetricsTokenAuthentication]
    permission_classes = [ScraperOnly]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = PrometheusText

    @extend_schema(exclude=True)  # an operator's endpoint, not part of the API
    def get(self, request):
        registry = scrape_registry(SnapshotCollector())
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [path("metrics", MetricsView.as_view())]


def _group_families(groups: dict) -> list[GaugeMetricFamily]:
    """The quota groups' guarantee, limit and what their subtrees hold, from the snapshot."""
    labels = ["organization", "group", "resource"]
    guaranteed = GaugeMetricFamily(
        "manta_quota_group_guaranteed", "Quota group guarantee", labels=labels
    )
    limit = GaugeMetricFamily(
        "manta_quota_group_limit", "Quota group limit (where one is set)", labels=labels
    )
    reserved = GaugeMetricFamily(
        "manta_quota_group_reserved",
        "Held by the launching/running jobs of the group's workspaces, at any depth",
        labels=labels,
    )
    for group in groups.values():
        names = [group["organization"], group["group"]]
        for resource in RESOURCES:
            guaranteed.add_metric([*names, resource], group["guaranteed"].get(resource, 0.0))
            if resource in group["limit"]:
                limit.add_metric([*names, resource], group["limit"][resource])
            reserved.add_metric([*names, resource], group["reserved"].get(resource, 0.0))
    return [guaranteed, limit, reserved]
