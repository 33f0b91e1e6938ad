"""logs/: lines never disappear while an attempt runs, the archive answers only once written,
and ``since`` returns only new text. The clusters here are unreachable (their dashboard address
has nothing listening), as when a head is lost; live reads against real Ray are in tests/e2e."""

from __future__ import annotations

import socket

import pytest
from django.utils import timezone

from config import secrets
from jobs.launchers.base import LogPart
from jobs.log_archive import log_archive_save
from jobs.models import JobAttempt
from tests.jobs.conftest import submit

WS = "/api/v1/orgs/acme/workspaces/ml/"
LOG = "".join(f"line {n}\n" for n in range(10))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def attempt(world, template):
    """A running attempt whose cluster stopped answering, with Manta's copy of its log."""
    job = submit(world, template)
    handle = {
        "kind": "local",
        "cluster_name": "gone",
        "submission_id": "s-1",
        "token": "t",
        "dashboard_url": f"http://127.0.0.1:{closed_port()}",
        "nodes": [],
    }
    return JobAttempt.objects.create(
        job=job,
        number=1,
        cluster_name="gone",
        submitted=True,
        handle_encrypted=secrets.encrypt_json(handle),
        log_archive=LOG,
        log_saved_at=timezone.now(),
    )


def whole(text: str) -> LogPart:
    """A log read whole, as a launcher hands it over (ASCII: one byte per character)."""
    return LogPart(text=text, start=0, end=len(text))


def logs(world, job_id, **params):
    response = world.client("developer").get(f"{WS}jobs/{job_id}/logs/", params)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_running_attempt_whose_cluster_is_silent_answers_with_mantas_copy(world, attempt):
    body = logs(world, attempt.job_id)
    assert body == {"attempt": 1, "source": "live", "logs": LOG, "offset": len(LOG)}


def test_since_returns_only_new_text(world, attempt):
    middle = len("".join(f"line {n}\n" for n in range(7)))
    body = logs(world, attempt.job_id, since=middle)
    assert body["logs"] == "line 7\nline 8\nline 9\n" and body["offset"] == len(LOG)
    assert logs(world, attempt.job_id, since=len(LOG))["logs"] == ""
    assert logs(world, attempt.job_id, since=10**9)["logs"] == ""


def test_the_archive_answers_once_written_and_keeps_offsets_of_the_whole_log(
    world, attempt, settings
):
    # A log longer than the archive keeps its end, after a line that says what was dropped;
    # offsets still count from the log's start.
    settings.MANTA_LOG_ARCHIVE_BYTES = limit = 4096
    long = "x" * (limit + 5) + "end\n"
    assert log_archive_save(attempt.pk, whole(long))
    JobAttempt.objects.filter(pk=attempt.pk).update(torn_down_at=timezone.now())
    body = logs(world, attempt.job_id)
    assert body["source"] == "archive" and body["offset"] == len(long)
    dropped = (
        f"[manta: the first 9 bytes of this log were dropped; the archive keeps the last {limit}]\n"
    )
    assert body["logs"] == dropped + long[-limit:]
    assert logs(world, attempt.job_id, since=len(long) - 4)["logs"] == "end\n"
    assert logs(world, attempt.job_id, tail=1)["logs"] == "x" * (limit - 4) + "end\n"
    # Asked from before what is kept: everything kept, after the line saying what is not.
    assert logs(world, attempt.job_id, since=0)["logs"] == body["logs"]


def test_following_an_ended_attempt_streams_its_archive_from_since(world, attempt):
    JobAttempt.objects.filter(pk=attempt.pk).update(torn_down_at=timezone.now(), state="failed")
    url = f"{WS}jobs/{attempt.job_id}/logs/"
    whole = world.client("developer").get(url, {"follow": "true"})
    assert b"".join(whole.streaming_content).decode() == LOG
    rest = world.client("developer").get(url, {"follow": "true", "since": len(LOG) - 7})
    assert b"".join(rest.streaming_content).decode() == "line 9\n"


def test_a_shorter_log_never_replaces_a_longer_copy(attempt):
    assert not log_archive_save(attempt.pk, whole("line 0\n"))
    attempt.refresh_from_db()
    assert attempt.log_archive == LOG
    assert log_archive_save(attempt.pk, whole(LOG + "line 10\n"))
    attempt.refresh_from_db()
    assert attempt.log_archive == LOG + "line 10\n" and attempt.log_start == 0


@pytest.mark.parametrize(
    ("params", "field", "rule"),
    [
        ({"since": -1}, "since", "greater than or equal to 0"),
        ({"since": "abc"}, "since", "A valid integer is required"),
        ({"since": 3, "tail": 2}, "since", "cannot be combined with tail"),
        ({"tail": 0}, "tail", "greater than or equal to 1"),
        ({"tail": 2, "follow": "true"}, "follow", "cannot be combined with tail"),
        ({"follow": "maybe"}, "follow", "Must be a valid boolean"),
    ],
)
def test_bad_log_queries_are_refused_naming_the_field(world, attempt, params, field, rule):
    response = world.client("developer").get(f"{WS}jobs/{attempt.job_id}/logs/", params)
    assert response.status_code == 400
    assert rule in str(response.json()), response.json()
    assert field in str(response.json())


def test_a_job_without_attempts_has_no_logs(world, template):
    job = submit(world, template)
    assert logs(world, job.pk) == {"attempt": None, "source": "none", "logs": "", "offset": 0}
