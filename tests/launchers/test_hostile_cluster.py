"""A job that replaced its cluster's dashboard with a server of its own cannot hold Manta's
requests, send them elsewhere or fill Manta's memory: every request to a dashboard (the Jobs
API client's, the version check in its constructor included, and the local launcher's health
check) ends within its deadline, follows no redirect and reads at most its size cap.

The dashboard here is a real server on 127.0.0.1 (``hostile_dashboard.py``), reached through
the real client and launchers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from jobs.launchers import dashboard_http, launcher_for, ray_jobs
from jobs.launchers.base import LaunchError
from jobs.launchers.local import LocalRayLauncher
from tests.launchers.hostile_dashboard import (
    Drip,
    Flood,
    HostileDashboard,
    Recorder,
    http_answer,
    json_answer,
    ray_version,
)

# Every read must end within its deadline plus a small margin: timed, on quiet CPUs.
pytestmark = pytest.mark.whole_host

DEADLINE = 2.0
MARGIN = 1.5  # thread scheduling and connection set-up, on a busy 2-core machine
MIB = 1024**2
SUBMISSION = "raysubmit_hostile"
JOB = {
    "type": "SUBMISSION",
    "submission_id": SUBMISSION,
    "status": "RUNNING",
    "entrypoint": "python main.py",
    "message": "running",
}


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    yield server
    server.close()


def hostile(everything_else, *, version_too: bool = False) -> HostileDashboard:
    """A dashboard that answers the version check as Ray does (unless ``version_too``) and
    every other request with ``everything_else``."""

    def answer(method: str, path: str):
        if not version_too and (normal := ray_version(method, path)):
            return normal
        return everything_else

    return HostileDashboard(answer)


def refused(call, deadline: float = DEADLINE) -> tuple[str, float]:
    """Run ``call``; it must raise LaunchError. Returns the message and the seconds taken."""
    began = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        call()
    return str(caught.value), time.monotonic() - began


def client(url: str, **limits):
    return ray_jobs.make_client(url, "token", timeout=DEADLINE, **limits)


# -- redirects ---------------------------------------------------------------------------------


def redirect_to(recorder: Recorder) -> bytes:
    return http_answer(302, headers={"Location": f"{recorder.url}/internal/secret"})


def test_a_redirect_in_the_version_check_is_refused_and_never_followed(recorder):
    with hostile(redirect_to(recorder), version_too=True) as dashboard:
        message, took = refused(lambda: client(dashboard.url))
    assert "302" in message and "redirects are not followed" in message
    assert recorder.contacted == [] and took < DEADLINE + MARGIN


@pytest.mark.parametrize(
    "call",
    [
        lambda c: ray_jobs.job_logs(c, SUBMISSION),
        lambda c: ray_jobs.job_state(c, SUBMISSION),
        lambda c: ray_jobs.stop_job(c, SUBMISSION),
        lambda c: ray_jobs.submit_idempotent(c, submission_id=SUBMISSION, entrypoint="true"),
    ],
    ids=["logs", "job info", "stop", "submit"],
)
def test_a_redirect_from_the_jobs_api_is_refused_and_never_followed(recorder, call):
    with hostile(redirect_to(recorder)) as dashboard:
        jobs_api = client(dashboard.url)
        message, took = refused(lambda: call(jobs_api))
    assert "302" in message and "redirects are not followed" in message
    assert recorder.contacted == [] and took < DEADLINE + MARGIN


def test_the_health_check_follows_no_redirect(recorder):
    handle = {"dashboard_url": "", "token": "t", "nodes": [], "cluster_name": "hostile"}
    with hostile(redirect_to(recorder), version_too=True) as dashboard:
        handle["dashboard_url"] = dashboard.url
        assert LocalRayLauncher().is_alive(handle) is False
        assert dashboard.requests == [("GET", "/api/gcs_healthz")]
    assert recorder.contacted == []


def test_a_redirect_of_the_ray_targets_logs_is_refused(recorder):
    with hostile(redirect_to(recorder)) as dashboard:
        config = {"address": dashboard.url, "allowed_networks": ["127.0.0.0/8"]}
        launcher = launcher_for("ray", config)
        message, _ = refused(lambda: launcher.logs({"submission_id": SUBMISSION}), 30)
    assert "redirects are not followed" in message and recorder.contacted == []


# -- dripping answers --------------------------------------------------------------------------


def dripped(body: bytes) -> Drip:
    return Drip(http_answer(200, body, {"Content-Type": "application/json"}), every=0.5)


def test_a_version_check_that_drips_its_headers_ends_at_the_deadline():
    with hostile(dripped(b"{}"), version_too=True) as dashboard:
        message, took = refused(lambda: client(dashboard.url))
    assert f"no complete answer within {DEADLINE:g} s" in message
    assert took < DEADLINE + MARGIN


def test_a_jobs_api_answer_that_drips_headers_then_body_ends_at_the_deadline():
    # Sent whole, the answer would take a minute: its headers alone take 20 s.
    with hostile(dripped(b'{"logs": "' + b"x" * 50 + b'"}')) as dashboard:
        jobs_api = client(dashboard.url)
        message, took = refused(lambda: ray_jobs.job_logs(jobs_api, SUBMISSION))
    assert f"no complete answer within {DEADLINE:g} s" in message
    assert took < DEADLINE + MARGIN


def test_a_body_that_drips_after_prompt_headers_ends_at_the_deadline():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 200\r\nContent-Type: application/json\r\n\r\n"
    # The headers at once, then the body a byte every half second.
    with hostile([head, Drip(b"{" + b" " * 199)]) as dashboard:
        jobs_api = client(dashboard.url)
        message, took = refused(lambda: ray_jobs.job_state(jobs_api, SUBMISSION))
    assert f"no complete answer within {DEADLINE:g} s" in message
    assert took < DEADLINE + MARGIN


def test_the_health_check_of_a_dripping_dashboard_ends_at_its_deadline():
    handle = {"dashboard_url": "", "token": "t", "nodes": [], "cluster_name": "hostile"}
    with hostile(dripped(b"ok"), version_too=True) as dashboard:
        handle["dashboard_url"] = dashboard.url
        began = time.monotonic()
        assert LocalRayLauncher().is_alive(handle) is False
        assert time.monotonic() - began < 2 + MARGIN


# -- huge answers ------------------------------------------------------------------------------


@pytest.mark.parametrize("announce", [False, True], ids=["unannounced", "content-length"])
def test_a_100_mib_answer_is_refused_at_the_cap(announce):
    with hostile(Flood(100 * MIB, announce=announce)) as dashboard:
        jobs_api = client(dashboard.url, answer_limit=8 * MIB)
        message, took = refused(lambda: ray_jobs.job_state(jobs_api, SUBMISSION))
        sent = dashboard.sent
    assert "8388608" in message and ("longer than" in message or "more than" in message)
    assert took < DEADLINE + MARGIN
    # Reading stopped at the cap: the rest was never taken from the server.
    assert sent < 100 * MIB


def test_a_100_mib_log_answer_is_refused_at_the_log_cap():
    with hostile(Flood(100 * MIB)) as dashboard:
        jobs_api = client(dashboard.url, log_limit=16 * MIB)
        message, took = refused(lambda: ray_jobs.log_part(jobs_api, SUBMISSION, limit=MIB))
    assert str(16 * MIB) in message and took < DEADLINE + MARGIN


def test_a_huge_version_answer_is_refused_in_the_constructor():
    with hostile(Flood(100 * MIB), version_too=True) as dashboard:
        message, took = refused(lambda: client(dashboard.url, answer_limit=MIB))
    assert "longer than the 1048576 allowed" in message and took < DEADLINE + MARGIN


# -- what a dashboard says is cleaned ---------------------------------------------------------


def test_status_messages_and_logs_from_the_jobs_api_come_back_clean():
    job = {**JOB, "message": "bad \x00 byte and a lone \udc80", "driver_exit_code": 2**40}

    def answer(method, path):
        if path.endswith("/logs"):
            return json_answer({"logs": "line\x00one\n\ud800line two\n"})
        return ray_version(method, path) or json_answer(job)

    with HostileDashboard(answer) as dashboard:
        jobs_api = client(dashboard.url)
        state = ray_jobs.job_state(jobs_api, SUBMISSION)
        assert state.message == "bad \ufffd byte and a lone \ufffd"
        assert state.exit_code is None  # not something an exit code column holds
        part = ray_jobs.log_part(jobs_api, SUBMISSION, limit=9)
        assert part.text == "line two\n" and (part.start, part.end) == (10, 19)
        assert ray_jobs.job_logs(jobs_api, SUBMISSION, tail=2) == "line\ufffdone\n\ufffdline two\n"


def test_an_answer_within_bounds_is_read_whole():
    """The bounds take nothing from a well-behaved dashboard."""
    body = b'{"logs": "' + b"y" * (3 * MIB) + b'"}'
    with hostile(http_answer(200, body, {"Content-Type": "application/json"})) as dashboard:
        jobs_api = client(dashboard.url)
        assert len(ray_jobs.job_logs(jobs_api, SUBMISSION)) == 3 * MIB


def test_the_exchange_refuses_what_is_not_a_dashboard_address():
    with pytest.raises(dashboard_http.DashboardError, match="not a dashboard address"):
        dashboard_http.exchange("GET", "file:///etc/passwd")
