"""A running job's Ray Dashboard through Manta (jobs/api/dashboard.py): who may read it, what
passes and what is refused, and that whatever the dashboard answers stays bounded.

The dashboard here is a real HTTP server on 127.0.0.1 standing in for the cluster's (the proxy's
rules are what is tested; tests/e2e/test_launch.py reads a real Ray cluster's dashboard through
the API), or, for the hostile answers, a job's own server in its place
(tests/launchers/hostile_dashboard.py). The database, the tenant checks, the signing and the
HTTP exchanges are the real ones."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.http import urlencode
from rest_framework.test import APIClient

from config import secrets
from jobs.api import dashboard
from jobs.models import AttemptState, JobState
from tests.conftest import PASSWORD, SYSTEM
from tests.factories import JobAttemptFactory, JobFactory
from tests.launchers.hostile_dashboard import Drip, Flood, HostileDashboard, Recorder, http_answer
from tests.matrix import WS_VISIBLE
from workspaces import services as workspace_services

WS = "/api/v1/orgs/acme/workspaces/ml/"
TOKEN = "ray-token-" + "7" * 32
INDEX = (
    b'<!doctype html><html lang="en"><head><meta charset="utf-8"/><title>Ray Dashboard</title>'
    b'<script defer="defer" src="./static/js/main.js"></script></head><body><div id="root">'
    b"</div></body></html>"
)


class Upstream:
    """A dashboard on 127.0.0.1 that notes every request (method, path, headers) and answers
    ``answer(method, path, headers)`` -> (status, headers, body)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.answer = self.ray_like
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def handle_one(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                upstream.seen.append((self.command, self.path, headers))
                status, extra, body = upstream.answer(self.command, self.path, headers)
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = handle_one

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        serve = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        serve.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def ray_like(method: str, path: str, headers: dict[str, str]):
        if headers.get("authorization") != f"Bearer {TOKEN}":
            return 401, {"Content-Type": "text/plain"}, b"Unauthorized: token required"
        if path == "/":
            return 200, {"Content-Type": "text/html", "Set-Cookie": f"ray-token={TOKEN}"}, INDEX
        if path.startswith("/api/jobs/"):
            jobs = [{"submission_id": "raysubmit_1", "status": "RUNNING"}]
            cached = {"Cache-Control": "no-cache", "ETag": '"v1"', "X-Ray-Internal": "1"}
            return 200, {"Content-Type": "application/json", **cached}, json.dumps(jobs).encode()
        return 404, {"Content-Type": "text/plain"}, b"404: Not Found"


@pytest.fixture
def upstream():
    server = Upstream()
    yield server
    server.close()


def running_job(world, url: str, **attempt):
    """A running job of acme/ml whose attempt's cluster has its dashboard at ``url``."""
    job = JobFactory(workspace=world.ws, state=JobState.RUNNING)
    handle = {"kind": "local", "dashboard_url": url, "token": TOKEN, "cluster_name": "c"}
    JobAttemptFactory(
        job=job,
        cluster_ready_at=timezone.now(),
        dashboard_url=url,
        handle_encrypted=secrets.encrypt_json(handle),
        **attempt,
    )
    return job


def url_of(job, path: str = "") -> str:
    return f"{WS}jobs/{job.pk}/dashboard/{path}"


def test_a_viewer_reads_the_dashboard_and_manta_adds_the_token(world, upstream):
    job = running_job(world, upstream.url)
    response = world.client("viewer").get(url_of(job, "api/jobs/"), {"limit": "5"})
    assert response.status_code == 200, response.content
    assert json.loads(response.content) == [{"submission_id": "raysubmit_1", "status": "RUNNING"}]
    [(method, path, headers)] = upstream.seen
    assert (method, path) == ("GET", "/api/jobs/?limit=5")
    # The cluster's token replaces the caller's Manta token, which never reaches the cluster.
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert world.tokens["viewer"] not in json.dumps(headers)
    assert "cookie" not in headers
    # Only the safe headers pass; Manta sets its own rules for the page.
    assert response["Content-Type"] == "application/json"
    assert response["ETag"] == '"v1"' and response["Cache-Control"] == "no-cache"
    assert "X-Ray-Internal" not in response
    assert response["Content-Security-Policy"].startswith("sandbox allow-scripts ")
    assert "allow-same-origin" not in response["Content-Security-Policy"]
    assert response["X-Frame-Options"] == "DENY"
    assert "Access-Control-Allow-Origin" not in response  # only a dashboard link's answers


def test_the_path_reaches_the_dashboard_as_its_router_reads_it(world, upstream):
    job = running_job(world, upstream.url)
    client = world.client("viewer")
    for path in ["api/jobs/", "static/../api/jobs/", "api//jobs/", "", "./"]:
        client.get(url_of(job, path))
    assert [seen[1] for seen in upstream.seen] == ["/api/jobs/"] * 3 + ["/"] * 2


def test_the_page_keeps_its_relative_assets_and_never_gets_the_token(world, upstream):
    job = running_job(world, upstream.url)
    response = world.client("developer").get(url_of(job))
    assert response.status_code == 200
    body = response.content
    assert b'src="./static/js/main.js"' in body  # relative: it stays under the proxy's path
    # Storage is refused in an opaque origin: the page gets a memory-only one, in its head.
    assert body.index(b"<head>") < body.index(dashboard.STORAGE_SHIM) < body.index(b"<title>")
    assert "Set-Cookie" not in response and not response.cookies
    assert TOKEN.encode() not in body
    head = world.client("developer").head(url_of(job))
    assert head.status_code == 200 and head.content == b""
    assert [m for m, _, _ in upstream.seen] == ["GET", "HEAD"]


def test_what_the_dashboard_echoes_of_the_token_is_scrubbed(world, upstream):
    upstream.answer = lambda method, path, headers: (
        200,
        {"Content-Type": "text/plain", "ETag": headers["authorization"], "Location": "/x"},
        f"you sent {headers['authorization']}".encode(),
    )
    job = running_job(world, upstream.url)
    response = world.client("viewer").get(url_of(job, "echo"))
    assert response.status_code == 200
    assert TOKEN not in response.content.decode() and TOKEN not in str(response.headers)
    assert "Location" not in response


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_writes_are_refused_and_never_reach_the_cluster(world, upstream, method):
    job = running_job(world, upstream.url)
    client = world.client("developer")  # who may submit and cancel jobs, through Manta only
    response = getattr(client, method)(
        url_of(job, "api/jobs/"), {"entrypoint": "python evil.py"}, format="json"
    )
    assert response.status_code == 403, response.content
    body = response.json()
    assert body["type"] == "dashboard_read_only"
    assert method.upper() in body["detail"] and "read-only" in body["detail"]
    assert body["errors"]["method"] == [f"{method.upper()} is not allowed; GET and HEAD are"]
    assert upstream.seen == []


def test_a_browsers_post_is_refused_by_the_rule_not_by_csrf(world, upstream):
    job = running_job(world, upstream.url)
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(world.users["developer"])
    response = browser.post(url_of(job, "api/jobs/"), {"entrypoint": "x"}, format="json")
    assert response.status_code == 403
    assert response.json()["type"] == "dashboard_read_only"
    assert upstream.seen == []


@pytest.mark.parametrize(
    "path",
    [
        "worker/traceback?pid=1",
        "worker/cpu_profile?pid=1",
        "memory_profile",
        "task/x",
        "api/../worker/traceback",  # as the dashboard's router would resolve them
        "api/%2e%2e/worker/traceback",
        "/worker/traceback",
        "./memory_profile",
    ],
)
def test_gets_that_act_on_the_clusters_processes_are_refused(world, upstream, path):
    job = running_job(world, upstream.url)
    response = world.client("viewer").get(url_of(job, path))
    assert response.status_code == 403
    assert response.json()["errors"] == {"path": ["acts on the cluster's processes"]}
    assert upstream.seen == []


def test_everyone_who_may_view_the_job_reads_its_dashboard(world, upstream):
    job = running_job(world, upstream.url)
    for who in WS_VISIBLE:
        assert world.client(who).get(url_of(job, "api/jobs/")).status_code == 200, who
    assert len(upstream.seen) == len(WS_VISIBLE)


@pytest.mark.parametrize(
    ("who", "detail"),
    [("foreign", "No such organisation."), ("member", "No such workspace.")],
)
def test_who_may_not_view_the_job_gets_a_404_for_reads_and_writes(world, upstream, who, detail):
    job = running_job(world, upstream.url)
    for method in ("get", "post"):
        response = getattr(world.client(who), method)(url_of(job, "api/jobs/"))
        assert response.status_code == 404, (method, response.content)
        assert response.json()["detail"] == detail
    assert upstream.seen == []


def test_another_workspaces_job_is_a_404(world, upstream):
    other = JobFactory(organization=world.other_org, workspace__organization=world.other_org)
    response = world.client("owner").get(f"{WS}jobs/{other.pk}/dashboard/")
    assert response.status_code == 404
    assert response.json() == {"type": "not_found", "detail": "No such job.", "errors": {}}
    # A browser asking for HTML gets the same answer (JSON: no browsable API for a proxy).
    browser = world.client("owner").get(f"{WS}jobs/{other.pk}/dashboard/", HTTP_ACCEPT="text/html")
    assert browser.status_code == 404 and browser.json()["detail"] == "No such job."


def test_anonymous_is_refused(world, upstream):
    job = running_job(world, upstream.url)
    assert APIClient().get(url_of(job)).status_code == 401
    assert upstream.seen == []


def test_a_browser_not_signed_in_is_sent_to_sign_in_and_back(world, upstream):
    job = running_job(world, upstream.url)
    page = url_of(job, "static/js/main.js") + "?x=1"
    answer = Client().get(page, HTTP_ACCEPT="text/html,application/xhtml+xml")
    assert answer.status_code == 302
    assert answer["Location"] == "/api-auth/login/?" + urlencode({"next": page})
    assert upstream.seen == []
    # The sign-in page is there for any user, not only admins, and sends them back.
    viewer = world.users["viewer"]
    signed_in = Client()
    form = {"username": viewer.email, "password": PASSWORD, "next": page}
    signed_in.get(answer["Location"])
    done = signed_in.post("/api-auth/login/", form)
    assert done.status_code == 302 and done["Location"] == page
    # A write from a browser not signed in is still only a 401: nothing to come back to.
    assert Client().post(url_of(job, "api/jobs/"), HTTP_ACCEPT="text/html").status_code == 401


def test_a_queued_or_finished_job_says_the_dashboard_is_not_there(world):
    queued = JobFactory(workspace=world.ws, state=JobState.QUEUED)
    response = world.client("viewer").get(url_of(queued))
    assert response.status_code == 409
    body = response.json()
    assert body["type"] == "dashboard_unavailable" and "not up yet" in body["detail"]
    finished = JobFactory(workspace=world.ws, state=JobState.SUCCEEDED)
    JobAttemptFactory(job=finished, state=AttemptState.SUCCEEDED, cluster_ready_at=timezone.now())
    response = world.client("viewer").get(url_of(finished, "api/jobs/"))
    assert response.status_code == 409
    assert "has ended (succeeded)" in response.json()["detail"]
    assert "gone" in response.json()["detail"]


def test_a_shared_clusters_dashboard_is_not_shown(world, upstream):
    job = running_job(world, upstream.url, target_kind="ray", target_name="shared")
    response = world.client("viewer").get(url_of(job))
    assert response.status_code == 409
    assert response.json()["errors"] == {"compute_target": ["ray"]}
    assert "shared cluster" in response.json()["detail"]
    assert upstream.seen == []


def test_a_browser_session_is_sent_to_a_dashboard_link(world, upstream):
    job = running_job(world, upstream.url)
    browser = APIClient()
    browser.force_login(world.users["viewer"])
    response = browser.get(url_of(job, "api/jobs/"), {"view": "all"})
    assert response.status_code == 302
    location = response["Location"]
    match = re.fullmatch(re.escape(url_of(job, "-/")) + r"([^/]+)/api/jobs/\?view=all", location)
    assert match, location
    assert upstream.seen == []
    # The sandboxed page sends no cookie: the link alone is its credential.
    page = APIClient().get(location)
    assert page.status_code == 200, page.content
    assert page["Access-Control-Allow-Origin"] == "*"
    assert page["Referrer-Policy"] == "no-referrer"
    assert upstream.seen[0][1] == "/api/jobs/?view=all"
    assert upstream.seen[0][2]["authorization"] == f"Bearer {TOKEN}"
    # Writes through a link are refused like any other.
    assert APIClient().post(location, {}, format="json").status_code == 403


def test_a_dashboard_link_is_checked_on_every_request(world, upstream):
    job = running_job(world, upstream.url)
    browser = APIClient()
    browser.force_login(world.users["viewer"])
    location = browser.get(url_of(job))["Location"]
    link = location.split("/-/")[1].rstrip("/")
    forged = location.replace(link, link[:-2] + ("AA" if link[-2:] != "AA" else "BB"))
    assert APIClient().get(forged).status_code == 401
    # For another job's URL: that job's attempt is not the link's.
    other = running_job(world, upstream.url)
    response = APIClient().get(url_of(other, f"-/{link}/"))
    assert response.status_code == 409 and response.json()["errors"] == {
        "link": ["for another attempt"]
    }
    # A viewer who leaves the workspace loses the dashboard, link or not.
    membership = world.ws.memberships.get(user=world.users["viewer"])
    workspace_services.member_remove(actor=SYSTEM, membership=membership)
    assert APIClient().get(location).status_code == 404
    # An expired link says so.
    dashboard_seconds = dashboard.LINK_SECONDS
    try:
        dashboard.LINK_SECONDS = -1
        expired = APIClient().get(url_of(job, f"-/{link}/"))
    finally:
        dashboard.LINK_SECONDS = dashboard_seconds
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]


def test_the_attempt_shows_the_proxy_path_not_the_clusters_address(world, upstream):
    job = running_job(world, upstream.url)
    [attempt] = world.client("viewer").get(f"{WS}jobs/{job.pk}/").json()["attempts"]
    assert attempt["dashboard_url"] == url_of(job)
    listed = world.client("viewer").get(f"{WS}jobs/").json()["results"]
    assert upstream.url not in json.dumps(listed)
    job.attempts.update(state=AttemptState.SUCCEEDED)
    [attempt] = world.client("viewer").get(f"{WS}jobs/{job.pk}/").json()["attempts"]
    assert attempt["dashboard_url"] == ""


def test_a_redirect_is_not_followed_and_the_clusters_address_stays_inside(world):
    recorder = Recorder()
    answer = http_answer(302, b"", {"Location": f"{recorder.url}/steal"})
    with HostileDashboard(lambda method, path: answer) as hostile:
        address = hostile.url
        job = running_job(world, address)
        response = world.client("viewer").get(url_of(job, "api/jobs/"))
    recorder.close()
    assert response.status_code == 502
    body = response.json()
    assert (
        body["type"] == "dashboard_unreachable" and "redirects are not followed" in body["detail"]
    )
    assert address not in json.dumps(body)
    assert recorder.contacted == []


def test_a_huge_answer_is_cut_off_at_the_limit(world):
    with HostileDashboard(lambda method, path: Flood(200 * 1024**2)) as hostile:
        job = running_job(world, hostile.url)
        started = time.monotonic()
        response = world.client("viewer").get(url_of(job, "static/js/main.js"))
        assert time.monotonic() - started < 10
    assert response.status_code == 502
    assert "longer than" in response.json()["detail"]
    assert hostile.sent < 50 * 1024**2


def test_a_slow_dashboard_is_cut_off_at_the_deadline(world, monkeypatch):
    monkeypatch.setattr(dashboard, "TIMEOUT", 1.0)
    slow = Drip(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100, every=0.2)
    with HostileDashboard(lambda method, path: slow) as hostile:
        job = running_job(world, hostile.url)
        started = time.monotonic()
        response = world.client("viewer").get(url_of(job, "api/jobs/"))
        took = time.monotonic() - started
    assert response.status_code == 502 and took < 3, took
    assert "within 1 s" in response.json()["detail"]
