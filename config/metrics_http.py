"""API requests by route and status, with their latency (``manta_http_*``).

Our own middleware, not django-prometheus: its families are labelled by view name (one per
viewset action here, and nothing for the admin's or the static files' routes), and it would add
a dependency and a second naming scheme for a dozen lines. The route is the URL pattern that
matched (``api/v1/orgs/<slug:org>/workspaces/<slug:ws>/jobs/``), so the label set is bounded by
the URLconf, never by the ids in the paths; a path that matched nothing counts as ``unmatched``,
a static file as ``static``.
"""

from __future__ import annotations

import time

from django.conf import settings

from .metrics import HTTP_REQUESTS, HTTP_SECONDS, since


def route_of(request) -> str:
    match = getattr(request, "resolver_match", None)
    if match is not None and match.route:
        return "/" + match.route
    static = settings.STATIC_URL or "/static/"
    if request.path.startswith(static if static.startswith("/") else "/" + static):
        return "static"
    return "unmatched"


class RequestMetricsMiddleware:
    """First in ``MIDDLEWARE``: it times everything the others do too."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.monotonic()
        response = self.get_response(request)
        route = route_of(request)
        HTTP_SECONDS.labels(method=request.method, route=route).observe(since(started))
        HTTP_REQUESTS.labels(
            method=request.method, route=route, status=str(response.status_code)
        ).inc()
        return response
