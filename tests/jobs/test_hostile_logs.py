"""What a job puts in its log and its cluster's answers cannot stop Manta from following it: a NUL
or bytes that are not UTF-8 are stored replaced (PostgreSQL text holds no NUL), a log save that
fails skips neither the deadline nor the teardown, and a driver log of any size (a sparse file
of 768 MiB here) is read in pieces of a few MiB, by the follow step, the archive and logs/.

The cluster is a local cluster's files on disk (the head's driver log, where the local launcher
looks for it) and a server of the job's own in place of its dashboard
(``tests/launchers/hostile_dashboard.py``); the follow step, the launcher, the archive and the
database are the real ones."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from config import secrets
from jobs import following
from jobs.launchers import launcher_for
from jobs.launchers.local.launcher import LOG_LIMIT, LocalRayLauncher
from jobs.models import AttemptState, Job, JobAttempt, JobEvent, JobState
from tests.jobs.conftest import submit
from tests.launchers.hostile_dashboard import HostileDashboard, http_answer, ray_version

WS = "/api/v1/orgs/acme/workspaces/ml/"
SUBMISSION = "raysubmit_hostile"
MIB = 1024**2


class Cluster:
    """A local cluster as the launcher finds it: its dir, the head's session logs with the
    driver log, and a dashboard that answers what ``status`` and ``message`` say."""

    def __init__(self, root: str) -> None:
        self.dir = os.path.join(root, "mr-hostile")
        node_dir = os.path.join(self.dir, "head")
        self.logs = os.path.join(node_dir, "session_2026-01-01_00-00-00_000000_1", "logs")
        os.makedirs(self.logs)
        self.driver_log = os.path.join(self.logs, f"job-driver-{SUBMISSION}.log")
        self.status, self.message = "RUNNING", "running"
        self.dashboard = HostileDashboard(self._answer)
        gone = subprocess.Popen(["true"])  # a head pid no process has any more
        gone.wait()
        self.handle = {
            "kind": "local",
            "cluster_name": "hostile",
            "submission_id": SUBMISSION,
            "token": "t" * 32,
            "temp_dir": self.dir,
            "dashboard_url": self.dashboard.url,
            "stop_grace_seconds": 0.2,
            "nodes": [
                {
                    "role": "head",
                    "name": "head",
                    "temp_dir": node_dir,
                    "uid": os.getuid(),
                    "pid": gone.pid,
                    "pgid": gone.pid,
                }
            ],
        }

    def write_log(self, data: bytes) -> None:
        with open(self.driver_log, "wb") as f:
            f.write(data)

    def _answer(self, method: str, path: str) -> bytes:
        if (version := ray_version(method, path)) is not None:
            return version
        # Raw bytes in the JSON: what is not UTF-8 reaches the client as it is.
        message = json.dumps(self.message).encode().replace(b"<ff>", b"\xff\xfe")
        body = (
            b'{"type": "SUBMISSION", "submission_id": "%s", "entrypoint": "python main.py", '
            b'"status": "%s", "message": %s}'
        ) % (SUBMISSION.encode(), self.status.encode(), message)
        return http_answer(200, body, {"Content-Type": "application/json"})


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:
    made = Cluster(str(tmp_path))
    yield made
    made.dashboard.close()


@pytest.fixture
def attempt(world, template, cluster) -> JobAttempt:
    """A running attempt on ``cluster``, its log never saved yet."""
    job = submit(world, template)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    now = timezone.now()
    return JobAttempt.objects.create(
        job=job,
        number=1,
        cluster_name="hostile",
        state=AttemptState.RUNNING,
        submitted=True,
        submitted_at=now,
        running_at=now,
        handle_encrypted=secrets.encrypt_json(cluster.handle),
    )


def follow(attempt: JobAttempt) -> bool:
    """One follow step; True when another is to come."""
    return following.attempt_follow(str(attempt.pk), attempt.follow_token) is not None


def logs(world, job_id, **params) -> dict:
    response = world.client("developer").get(f"{WS}jobs/{job_id}/logs/", params)
    assert response.status_code == 200, response.content
    return response.json()


# -- NUL and bytes that are not UTF-8 ----------------------------------------------------------

LOG = b"started\n\x00 a NUL, \xff\xfe not UTF-8, \xed\xa0\x80 a surrogate\nlast line\n"
SHOWN = "started\n\ufffd a NUL, \ufffd\ufffd not UTF-8, \ufffd\ufffd\ufffd a surrogate\nlast line\n"


def test_a_follow_step_stores_nul_and_invalid_bytes_replaced(world, cluster, attempt):
    cluster.write_log(LOG)
    cluster.message = "step 3\u0000 of <ff> and \udc80"
    assert follow(attempt) is True
    attempt.refresh_from_db()
    assert attempt.ray_message == "step 3\ufffd of \ufffd\ufffd and \ufffd"
    assert attempt.log_archive == SHOWN and attempt.log_start == 0
    # Offsets count the log's bytes, live and in the archive alike: one per U+FFFD.
    live = logs(world, attempt.job_id)
    assert live == {"attempt": 1, "source": "live", "logs": SHOWN, "offset": len(LOG)}
    since = len(LOG) - len(b"last line\n")
    assert logs(world, attempt.job_id, since=since)["logs"] == "last line\n"
    JobAttempt.objects.filter(pk=attempt.pk).update(torn_down_at=timezone.now())
    assert logs(world, attempt.job_id) == {**live, "source": "archive"}
    assert logs(world, attempt.job_id, since=since)["logs"] == "last line\n"


def test_a_failed_job_whose_last_lines_hold_a_nul_is_settled_and_torn_down(world, cluster, attempt):
    cluster.write_log(LOG)
    cluster.status = "FAILED"
    cluster.message = "Job entrypoint command failed. Last lines:\n\u0000 <ff>\n"
    assert follow(attempt) is False
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FAILED and attempt.torn_down_at is not None
    assert "\x00" not in attempt.ray_message and "\ufffd \ufffd\ufffd" in attempt.ray_message
    assert attempt.log_archive == SHOWN
    assert not os.path.exists(cluster.dir)  # the cluster is gone
    event = JobEvent.objects.filter(job_id=attempt.job_id).latest("pk")
    assert event.data["message"] == attempt.ray_message
    assert Job.objects.get(pk=attempt.job_id).message == attempt.ray_message


def test_a_reader_while_the_cluster_is_torn_down_loses_no_line(
    world, cluster, attempt, monkeypatch
):
    """logs/ reads the cluster until the attempt is marked torn down, and the archive when
    the cluster cannot answer: the archive holds the cluster's last lines before it goes."""
    cluster.write_log(b"runtime env\n")
    assert follow(attempt) is True  # the periodic copy: the first line only
    cluster.write_log(b"runtime env\nrun started\n")
    seen, stop = [], LocalRayLauncher.stop

    def stop_then_read(self, handle):  # the real stop, and a reader right after it
        stop(self, handle)
        seen.append(logs(world, attempt.job_id))

    monkeypatch.setattr(LocalRayLauncher, "stop", stop_then_read)
    following.attempt_teardown(attempt)
    assert not os.path.exists(cluster.dir)
    [read] = seen
    assert read["source"] == "live" and read["logs"] == "runtime env\nrun started\n", read
    assert logs(world, attempt.job_id)["source"] == "archive"


@pytest.fixture
def log_saves_refused():
    """The database refuses every write of an attempt's log copy (a trigger raising), as it
    refused a NUL before: whatever the reason, the save raises."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION refuse_log_copy() RETURNS trigger AS $$
            BEGIN
                IF NEW.log_archive IS DISTINCT FROM OLD.log_archive THEN
                    RAISE EXCEPTION 'log copy refused';
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER refuse_log_copy BEFORE UPDATE ON jobs_jobattempt
                FOR EACH ROW EXECUTE FUNCTION refuse_log_copy();
            """
        )
    yield  # the test's transaction, rolled back, takes the trigger with it


def test_a_deadline_ends_the_attempt_even_when_the_log_save_raises(
    world, cluster, attempt, log_saves_refused, caplog
):
    cluster.write_log(LOG)
    job = attempt.job
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "max_runtime_seconds": 25})
    JobAttempt.objects.filter(pk=attempt.pk).update(
        running_at=timezone.now() - timedelta(seconds=76)
    )
    assert follow(attempt) is False
    assert "saving the log failed" in caplog.text and "log copy refused" in caplog.text
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FAILED
    assert attempt.failure_reason == "deadline_exceeded"
    assert attempt.torn_down_at is not None and attempt.log_archive == ""
    assert not os.path.exists(cluster.dir)
    assert Job.objects.get(pk=job.pk).state == JobState.FAILED


def test_a_follow_step_whose_log_save_raises_still_moves_the_job_to_running(
    world, cluster, attempt, log_saves_refused
):
    cluster.write_log(LOG)
    Job.objects.filter(pk=attempt.job_id).update(state=JobState.LAUNCHING)
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.LAUNCHING, running_at=None)
    assert follow(attempt) is True
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING and attempt.ray_seen_at is not None
    assert Job.objects.get(pk=attempt.job_id).state == JobState.RUNNING


# -- a sparse log of 768 MiB -------------------------------------------------------------------


def read_bytes() -> int:
    """Bytes this process has read through read() and its kin so far (/proc/self/io)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def peak_growth(call) -> tuple[int, int]:
    """Run ``call``; return the bytes it read and how far it raised this process's peak
    resident memory above what was resident before (the peak is reset first)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS

    def status(field: str) -> int:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith(field))
        return int(line.split()[1]) * 1024

    before, read_before = status("VmRSS:"), read_bytes()
    call()
    return read_bytes() - read_before, status("VmHWM:") - before


def test_a_sparse_768_mib_log_is_read_a_few_mib_at_a_time(world, settings, cluster, attempt):
    size = 768 * MIB
    end = b"second to last line\nlast line\n"
    with open(cluster.driver_log, "wb") as f:
        f.truncate(size - len(end))  # a hole: 768 MiB of NULs that take no disk
        f.seek(0, os.SEEK_END)
        f.write(end)
    assert os.stat(cluster.driver_log).st_blocks * 512 < MIB
    limit = settings.MANTA_LOG_ARCHIVE_BYTES
    launcher = launcher_for("local", {})
    # What a first request and a first status read import (Ray's client) is read once.
    logs(world, attempt.job_id, tail=1)
    launcher.status(cluster.handle)

    # What may be read: what was asked for, and a little more. The peak may grow by the piece's
    # text (each NUL a 3-byte U+FFFD), its copies on the way to the database or into JSON, and
    # the allocator's slack: far below the 768 MiB a whole read takes (old code: 1.5-2.3 GB).
    most_read, most_grown = limit + MIB, 96 * MIB
    cases = {
        "logs(tail=2)": lambda: launcher.logs(cluster.handle, tail=2),
        "the follow step's log copy": lambda: follow(attempt),
        "logs/": lambda: logs(world, attempt.job_id),
        "logs/?tail=": lambda: logs(world, attempt.job_id, tail=5),
        "logs/?since=0": lambda: logs(world, attempt.job_id, since=0),
    }
    for name, call in cases.items():
        read, grown = peak_growth(call)
        assert read < most_read, f"{name} read {read} bytes"
        assert grown < most_grown, f"{name} grew the peak RSS by {grown} bytes"

    assert launcher.logs(cluster.handle, tail=1) == "last line\n"
    # The line before it is 768 MiB long: what logs() holds of it is its end.
    two = launcher.logs(cluster.handle, tail=2)
    assert two.endswith(end.decode()) and len(two) <= LOG_LIMIT
    attempt.refresh_from_db()
    dropped = size - limit
    assert attempt.log_start == dropped
    assert attempt.log_archive.startswith(
        f"[manta: the first {dropped} bytes of this log were dropped; "
        f"the archive keeps the last {limit}]\n"
    )
    assert attempt.log_archive.endswith("\ufffd" + end.decode())
    whole = logs(world, attempt.job_id)
    assert whole["offset"] == size and whole["logs"].endswith(end.decode())
    assert whole["logs"].startswith(f"[manta: the first {dropped} bytes of this log are not")
    first = logs(world, attempt.job_id, since=0)
    assert first["offset"] == limit and first["logs"] == "\ufffd" * limit

    # The teardown's archive reads as little.
    read, grown = peak_growth(lambda: following.attempt_teardown(attempt))
    assert read < most_read and grown < most_grown
    attempt.refresh_from_db()
    assert attempt.torn_down_at is not None and attempt.log_start == dropped
