"""``/metrics`` in the Prometheus text format: job counts by state and the admission invariants'
drift (all zero when quotas hold). Aggregates only, no tenant names.

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
from django.db.models import Count
from django.http import HttpResponse
from django.urls import path
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from .accounting import reconcile
from .models import Job, JobState


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


class MetricsView(APIView):
    authentication_classes = [MetricsTokenAuthentication]
    permission_classes = [ScraperOnly]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = PrometheusText

    @extend_schema(exclude=True)  # an operator's endpoint, not part of the API
    def get(self, request):
        registry = CollectorRegistry()
        jobs = Gauge("manta_jobs", "Jobs by state", ["state"], registry=registry)
        counts = dict(Job.objects.order_by().values_list("state").annotate(n=Count("id")))
        for state in JobState.values:
            jobs.labels(state=state).set(counts.get(state, 0))
        drift = Gauge(
            "manta_quota_drift",
            "Admission invariants that do not hold (0 = healthy)",
            ["kind"],
            registry=registry,
        )
        for kind, value in reconcile().items():
            drift.labels(kind=kind).set(value)
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [path("metrics", MetricsView.as_view())]
