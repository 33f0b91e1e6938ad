"""Each running job's Ray Dashboard, through Manta: ``…/jobs/<id>/dashboard/<path>``.

Whoever may view the job may read its cluster's dashboard: pages, static assets and read APIs
(GET, HEAD). Writes (POST, PUT, PATCH, DELETE: a second job submitted, an actor killed, a Serve
app deployed) are refused, as are the GETs that act on the cluster's processes (profilers, stack
dumps). Manta adds the cluster's Ray token itself; it never reaches the browser.

What the dashboard answers is the tenant's (a job can replace its dashboard with a server of its
own), so every exchange goes through :func:`dashboard_http.exchange` (total deadline, no
redirects followed, bounded body), only a few headers pass, the token is scrubbed from bodies,
and pages are served under a ``sandbox`` CSP without ``allow-same-origin``: the page gets an
opaque origin, so its scripts cannot use the viewer's Manta session (cookies, CSRF token) against
the API or the admin. Such a page sends no cookies, so a browser signed in by session is sent to
a *dashboard link* instead: the same path under ``dashboard/-/<link>/``, where ``<link>`` is a
signed, expiring capability naming the user and the attempt; every request through it is checked
again (the user may still view the job, the attempt still runs). API clients with a bearer token
use the plain path. See docs/dashboard.md.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from urllib.parse import quote

from django.conf import settings
from django.core import signing
from django.http import HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import urlencode
from rest_framework import authentication, exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer

from config.errors import Conflict, DomainError, Forbidden
from jobs import selectors
from jobs.attempts import handle_of
from jobs.launchers import dashboard_http
from jobs.models import ATTEMPT_ACTIVE, Job, JobAttempt
from workspaces import roles
from workspaces.api.tenancy import WorkspaceViewSet
from workspaces.authentication import BearerTokenAuthentication
from workspaces.models import User

ROUTE_NAME = "job-dashboard"
LINK_SALT = "manta.jobs.dashboard-link"
LINK_SECONDS = 8 * 3600  # a dashboard tab left open for a working day
TIMEOUT = 15.0  # seconds, total, per proxied request: a gunicorn worker waits that long at most
LIMIT = dashboard_http.ANSWER_LIMIT  # bytes; Ray's largest asset (main.js) is about 1.1 MB
WRITE_METHODS = ("post", "put", "patch", "delete")
PATH_SAFE = "/:@!$&'()*+,;=-._~"  # what a path keeps unquoted (RFC 3986 pchar and "/")

# GETs of Ray's dashboard that act on the cluster's processes: py-spy, memray and profilers.
ACTING_PATHS = re.compile(r"^(worker/|task/|memory_profile|test/|api/v0/delay/)")
REQUEST_HEADERS = ("accept", "accept-language", "if-none-match", "if-modified-since")
RESPONSE_HEADERS = ("content-type", "cache-control", "etag", "last-modified")
# An opaque origin: scripts run, popups open (the dashboard opens logs in a new tab), downloads
# work; nothing reaches Manta's origin with the viewer's cookies, and nothing frames the page.
CSP = (
    "sandbox allow-scripts allow-popups allow-downloads; frame-ancestors 'none'; "
    "form-action 'none'; base-uri 'none'"
)
# In an opaque origin, localStorage, sessionStorage and document.cookie throw; Ray's dashboard
# reads storage while it renders (its theme, its time zone) and its HTTP client reads the cookie
# before each request, so it would stay blank. This gives it memory-only storage and no cookies.
STORAGE_SHIM = (
    b"<script>(function(){['localStorage','sessionStorage'].forEach(function(n){"
    b"try{window[n].length;}catch(e){var m=new Map(),s={"
    b"getItem:function(k){k=String(k);return m.has(k)?m.get(k):null;},"
    b"setItem:function(k,v){m.set(String(k),String(v));},"
    b"removeItem:function(k){m.delete(String(k));},clear:function(){m.clear();},"
    b"key:function(i){var a=Array.from(m.keys());return i<a.length?a[i]:null;},"
    b"get length(){return m.size;}};"
    b"Object.defineProperty(window,n,{value:s,configurable:true});}});"
    b"try{document.cookie;}catch(e){Object.defineProperty(document,'cookie',"
    b"{get:function(){return '';},set:function(v){},configurable:true});}})();</script>"
)
HEAD_TAG = re.compile(rb"<head[^>]*>", re.IGNORECASE)


class DashboardUnavailable(Conflict):
    type = "dashboard_unavailable"


class DashboardReadOnly(Forbidden):
    type = "dashboard_read_only"


class DashboardUnreachable(DomainError):
    type = "dashboard_unreachable"
    status_code = 502


@dataclasses.dataclass(frozen=True)
class DashboardLink:
    """What a dashboard link grants: reading one attempt's dashboard as one user."""

    attempt_id: str


def link_for(user: User, attempt: JobAttempt) -> str:
    return signing.dumps({"u": user.pk, "a": str(attempt.pk)}, salt=LINK_SALT, compress=False)


def proxy_path(attempt: JobAttempt) -> str:
    """The path of the attempt's dashboard through Manta ("" while it has none to show).
    Reads ``attempt.job.workspace.organization`` (select them)."""
    if attempt.target_kind != "local" or attempt.state not in ATTEMPT_ACTIVE:
        return ""
    if attempt.cluster_ready_at is None:
        return ""
    job = attempt.job
    kwargs = {"org": job.workspace.organization.slug, "ws": job.workspace.slug, "pk": job.pk}
    return reverse(ROUTE_NAME, kwargs=kwargs)


class DashboardLinkAuthentication(authentication.BaseAuthentication):
    """A dashboard link in the URL (``…/dashboard/-/<link>/``): its user, for its attempt only."""

    def authenticate(self, request):
        match = getattr(request._request, "resolver_match", None)
        link = match.kwargs.get("link") if match else None
        if link is None:
            return None
        try:
            data = signing.loads(link, salt=LINK_SALT, max_age=LINK_SECONDS)
        except signing.SignatureExpired:
            raise exceptions.AuthenticationFailed(
                "the dashboard link has expired: open the dashboard from the job again"
            ) from None
        except signing.BadSignature:
            raise exceptions.AuthenticationFailed("not a dashboard link") from None
        user = User.objects.filter(pk=data.get("u"), is_active=True).first()
        if user is None:
            raise exceptions.AuthenticationFailed("not a dashboard link")
        return user, DashboardLink(attempt_id=str(data.get("a")))

    def authenticate_header(self, request):
        return "Bearer"


class SessionReadAuthentication(authentication.SessionAuthentication):
    """The browser's session, without DRF's CSRF check: this view refuses every write whoever
    asks, and a CSRF failure would hide the rule's own answer behind a generic one."""

    def enforce_csrf(self, request):
        return None


class AnyAccept(DefaultContentNegotiation):
    """A browser asks for CSS, images or scripts here: what it accepts never makes a 406; an
    error is then JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except exceptions.NotAcceptable:
            return renderers[0], renderers[0].media_type


def running_attempt(job: Job) -> JobAttempt:
    """The attempt whose dashboard can be shown, or DashboardUnavailable saying why not."""
    attempt = (
        job.attempts.filter(state__in=ATTEMPT_ACTIVE, cluster_ready_at__isnull=False)
        .order_by("-number")
        .first()
    )
    if attempt is None:
        if job.is_terminal or job.attempts.exists():
            when = "has ended" if job.is_terminal else "is between attempts"
            detail = (
                f"Job {job.pk} {when} ({job.state}): its Ray cluster, and the cluster's "
                "dashboard with it, are gone. Its logs and timeline stay on the job."
            )
        else:
            detail = (
                f"Job {job.pk} is {job.state}: its Ray cluster is not up yet, so there is no "
                "dashboard to show. It appears once the job is launched."
            )
        raise DashboardUnavailable(detail, errors={"state": [job.state]})
    if attempt.target_kind != "local":
        why = (
            "a shared cluster's dashboard shows every job on it"
            if attempt.target_kind == "ray"
            else "its cluster's dashboard is not reachable from Manta's API"
        )
        raise DashboardUnavailable(
            f"Job {job.pk} runs on a {attempt.target_kind!r} compute target, whose dashboard is "
            f"not shown here: {why}. Only the clusters of the local target are.",
            errors={"compute_target": [attempt.target_kind]},
        )
    return attempt


class JobDashboardViewSet(WorkspaceViewSet):
    """A reverse proxy to a running job's Ray Dashboard (read only). Not in the OpenAPI schema:
    its answers are the dashboard's, not the API's."""

    queryset = Job.objects.none()
    workspace_field = "workspace"
    not_found_message = "No such job."
    authentication_classes = [
        DashboardLinkAuthentication,
        BearerTokenAuthentication,
        SessionReadAuthentication,
    ]
    content_negotiation_class = AnyAccept
    # Manta's own answers here (refusals, "the cluster is gone") are JSON: a browser asking for
    # HTML must not get the browsable API, which has no form for a proxy.
    renderer_classes = [JSONRenderer]
    permission_map = {"proxy": roles.WS_VIEW, "refuse": roles.WS_VIEW}
    schema = None

    def base_queryset(self):
        return selectors.jobs_of(self.workspace)

    def proxy(self, request, org=None, ws=None, pk=None, link=None, path=""):
        job = self.get_object()
        attempt = running_attempt(job)
        via_link = isinstance(request.auth, DashboardLink)
        if via_link and request.auth.attempt_id != str(attempt.pk):
            raise DashboardUnavailable(
                "This dashboard link is for an attempt that is no longer running: open the "
                "dashboard from the job again.",
                errors={"link": ["for another attempt"]},
            )
        if not via_link and isinstance(request.successful_authenticator, SessionReadAuthentication):
            return self._to_link(request, attempt, path)
        # As the dashboard's router would read it: "api/../worker/x" and "/worker/x" are worker/x.
        path = posixpath.normpath("/" + path).lstrip("/") + ("/" if path.endswith("/") else "")
        if path == "/":
            path = ""
        if ACTING_PATHS.match(path):
            raise DashboardReadOnly(
                f"The Ray dashboard is read-only through Manta: {path.split('/')[0]}/ acts on "
                "the cluster's processes (profiling, stack dumps) and is refused.",
                errors={"path": ["acts on the cluster's processes"]},
            )
        return self._forward(request, attempt, path, cross_origin=via_link)

    def handle_exception(self, exc):
        if isinstance(exc, exceptions.NotAuthenticated) and self._browser_page(self.request):
            # A person who opened the dashboard's address in a browser not yet signed in: to
            # the sign-in page, and back here after it.
            target = urlencode({"next": self.request.get_full_path()})
            response = HttpResponseRedirect(f"{reverse(settings.LOGIN_URL)}?{target}")
            response["Cache-Control"] = "no-store"
            return response
        return super().handle_exception(exc)

    @staticmethod
    def _browser_page(request) -> bool:
        accept = request.headers.get("accept", "")
        return request.method in ("GET", "HEAD") and "text/html" in accept

    def check_action_permission(self) -> None:
        super().check_action_permission()
        if self.action == "refuse":
            # Here, before the body is read: a write is refused whatever it carries.
            self.refuse(self.request)

    def refuse(self, request, org=None, ws=None, pk=None, link=None, path=""):
        self.get_object()  # another tenant's job stays a 404
        raise DashboardReadOnly(
            f"The Ray dashboard is read-only through Manta: {request.method} is refused (no job "
            "is submitted, stopped or deleted and no actor killed from it; submit and cancel "
            "jobs through Manta's API, under its quotas and audit).",
            errors={"method": [f"{request.method} is not allowed; GET and HEAD are"]},
        )

    def _to_link(self, request, attempt: JobAttempt, path: str) -> HttpResponse:
        base = reverse(ROUTE_NAME, kwargs={key: self.kwargs[key] for key in ("org", "ws", "pk")})
        target = f"{base}-/{link_for(request.user, attempt)}/{quote(path)}"
        if request.META.get("QUERY_STRING"):
            target += "?" + request.META["QUERY_STRING"]
        response = HttpResponseRedirect(target)
        response["Cache-Control"] = "no-store"
        response["Referrer-Policy"] = "no-referrer"
        return response

    def _forward(self, request, attempt: JobAttempt, path: str, *, cross_origin: bool):
        handle = handle_of(attempt) or {}
        address, token = handle.get("dashboard_url") or "", handle.get("token") or ""
        if not address or not token:
            raise DashboardUnavailable(
                f"Job {attempt.job_id}'s cluster has no dashboard address yet.",
                errors={"state": [attempt.state]},
            )
        url = f"{address}/{quote(path, safe=PATH_SAFE)}"
        if request.META.get("QUERY_STRING"):
            url += "?" + request.META["QUERY_STRING"]
        headers = {k: v for k in REQUEST_HEADERS if (v := request.headers.get(k))}
        headers["Authorization"] = f"Bearer {token}"
        try:
            answer = dashboard_http.exchange(
                request.method, url, headers=headers, timeout=TIMEOUT, limit=LIMIT
            )
        except dashboard_http.DashboardError as exc:
            # The message names the cluster's address on the worker host: not for tenants.
            message = str(exc).replace(address, "the dashboard")
            raise DashboardUnreachable(
                f"Job {attempt.job_id}'s Ray dashboard gave no usable answer: {message}",
                errors={"dashboard": [message]},
            ) from exc
        return self._render(answer, token, cross_origin=cross_origin)

    def _render(self, answer: dashboard_http.Answer, token: str, *, cross_origin: bool):
        body = answer.body.replace(token.encode(), b"[token]")
        kind = answer.headers.get("content-type", "application/octet-stream")
        if kind.lower().startswith("text/html"):
            head = HEAD_TAG.search(body)
            at = head.end() if head else 0
            body = body[:at] + STORAGE_SHIM + body[at:]
        response = HttpResponse(body, status=answer.status)
        for name in RESPONSE_HEADERS:
            if name in answer.headers:
                response[name] = answer.headers[name].replace(token, "[token]")
        response["Content-Type"] = kind
        response.setdefault("Cache-Control", "private, no-cache")
        response["Content-Security-Policy"] = CSP
        response["X-Frame-Options"] = "DENY"
        response["X-Content-Type-Options"] = "nosniff"
        response["Referrer-Policy"] = "no-referrer"  # the link is in the URL
        if cross_origin:
            # The sandboxed page has an opaque origin: its requests for the dashboard's APIs
            # are cross-origin, and carry the link, never a cookie.
            response["Access-Control-Allow-Origin"] = "*"
        return response
