"""Following a job: its state changes as they happen, its driver log printed once across
attempts, the exit code from how it ended, and Ctrl-C offering to cancel it.

No cluster runs here: the test moves the job through the state machine itself and writes the
attempts' logs into Manta's own copy, which the logs endpoint serves while a cluster is silent
(the attempts' dashboards point at a closed port) — what the CLI sees is the real API's."""

from __future__ import annotations

import io
import json
import signal
import socket
import time

import pytest
from django.utils import timezone
from manta import Client, ConnectionFailed
from manta.follow import StatusLine, follow
from rich.console import Console

from config import secrets
from jobs import state
from jobs.models import Job, JobAttempt
from tests.conftest import SYSTEM
from tests.jobs.conftest import submit as submit_job

from .conftest import wait_until


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_attempt(job: Job, number: int, log: str) -> JobAttempt:
    state.transition(job.pk, "launching", actor=SYSTEM)
    handle = {
        "kind": "local",
        "cluster_name": f"silent-{number}",
        "submission_id": f"s-{number}",
        "token": "t",
        "dashboard_url": f"http://127.0.0.1:{closed_port()}",
        "nodes": [],
    }
    attempt = JobAttempt.objects.create(
        job=job,
        number=number,
        cluster_name=f"silent-{number}",
        submitted=True,
        handle_encrypted=secrets.encrypt_json(handle),
        log_archive=log,
        log_saved_at=timezone.now(),
    )
    state.transition(job.pk, "running", actor=SYSTEM)
    return attempt


def write_log(attempt: JobAttempt, text: str, *, torn_down: bool = False) -> None:
    changes = {"log_archive": text, "log_saved_at": timezone.now()}
    if torn_down:
        changes["torn_down_at"] = timezone.now()
    JobAttempt.objects.filter(pk=attempt.pk).update(**changes)


def the_job() -> Job:
    return wait_until(lambda: Job.objects.order_by("-id").first(), message="the job")


def test_submit_follow_streams_every_attempt_once_and_exits_0(manta, counter):
    cli = manta.process("developer", "submit", "--template", "counter", "--follow")
    job = the_job()
    cli.expect(f"job {job.pk}: queued (position 1 of 1)", on="stderr")

    first = start_attempt(job, 1, "one\n")
    cli.expect("running (attempt 1", on="stderr")
    cli.expect("one")
    write_log(first, "one\ntwo")  # an unfinished line waits for its end
    # Retried: the first attempt's log ends without a newline, the second starts from 0.
    write_log(first, "one\ntwo", torn_down=True)
    state.transition(job.pk, "queued", actor=SYSTEM, kind="retry")
    second = start_attempt(job, 2, "three\n")
    cli.expect("three")
    cli.expect("running (attempt 2", on="stderr")
    write_log(second, "three\nfour\n", torn_down=True)
    state.transition(job.pk, "succeeded", actor=SYSTEM)

    assert cli.wait() == 0, cli.stderr
    assert cli.stdout == "one\ntwo\n----- attempt 2 -----\nthree\nfour\n"
    stderr = cli.stderr
    assert f"submitted job {job.pk}" in stderr
    assert stderr.index("queued") < stderr.index("running (attempt 1") < stderr.index("attempt 2")
    assert stderr.rstrip().endswith(f"job {job.pk} succeeded")


def test_a_failed_job_exits_1_and_says_why(manta, counter):
    cli = manta.process("developer", "submit", "--template", "counter", "-f")
    job = the_job()
    cli.expect("queued", on="stderr")
    state.transition(job.pk, "launching", actor=SYSTEM)
    state.transition(
        job.pk,
        "failed",
        actor=SYSTEM,
        mutate=lambda j: setattr(j, "failure_reason", "launch_failed"),
    )
    assert cli.wait() == 1
    assert "failed: launch_failed" in cli.stderr


def test_ctrl_c_asks_and_cancels_the_job(manta, counter):
    cli = manta.process("developer", "submit", "--template", "counter", "--follow")
    job = the_job()
    cli.expect("queued", on="stderr")
    cli.proc.send_signal(signal.SIGINT)
    cli.expect(f"Cancel job {job.pk}? [y/N]", on="stderr")
    cli.answer("y\n")
    assert cli.wait() == 130
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert f"job {job.pk} cancelled" in cli.stderr


def test_ctrl_c_answered_no_leaves_the_job(manta, counter):
    cli = manta.process("developer", "submit", "--template", "counter", "--follow")
    job = the_job()
    cli.expect("queued", on="stderr")
    cli.proc.send_signal(signal.SIGINT)
    cli.expect("[y/N]", on="stderr")
    cli.answer(None)  # no answer is no
    assert cli.wait() == 130
    job.refresh_from_db()
    assert job.state == "queued"


def test_jobs_logs_follow_of_an_ended_job(manta, live_world, counter):
    job = submit_job(live_world, counter)
    attempt = start_attempt(job, 1, "")
    write_log(attempt, "done\n", torn_down=True)
    state.transition(job.pk, "succeeded", actor=SYSTEM)

    result = manta.as_user("developer", "jobs", "logs", str(job.pk), "-f")
    assert result.exit_code == 0, result.output
    assert result.stdout == "done\n"
    assert f"job {job.pk}: succeeded" in result.stderr

    # With JSON output the log goes to stderr and stdout is the ended job alone.
    as_json = manta.as_user("developer", "-o", "json", "jobs", "logs", str(job.pk), "--follow")
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout)["state"] == "succeeded"
    assert "done\n" in as_json.stderr

    plain = manta.as_user("developer", "jobs", "logs", str(job.pk), "--tail", "1")
    assert plain.exit_code == 0 and plain.stdout == "done\n"


def test_follow_of_a_job_that_waits_for_approval_says_why(manta, live_world, counter):
    live_world.ws.approval_policy = "always"
    live_world.ws.save()
    cli = manta.process(
        "developer", "jobs", "logs", "--follow", str(submit_job(live_world, counter).pk)
    )
    cli.expect("pending approval: the workspace requires approval for every job", on="stderr")
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait() == 130  # only watching: nothing to ask
    assert "Cancel job" not in cli.stderr


def test_a_follower_waits_for_a_silent_server_then_gives_up():
    out = io.StringIO()
    status = StatusLine(1, Console(file=out))
    url = f"http://127.0.0.1:{closed_port()}"
    with Client(url, "mnt_x", org="acme", workspace="ml", retries=0) as client:
        started = time.monotonic()
        with pytest.raises(ConnectionFailed):
            follow(client, 1, status=status, logs=None, interval=0.05, outage_seconds=0.5)
    assert time.monotonic() - started >= 0.5
    assert "the server does not answer" in out.getvalue()
