"""What a job wrote reaches the user's terminal as text, never as control: its log (printed or
followed), its failure message and everything else the CLI shows from the server has its
control characters escaped (``\\x1b``), unless ``--raw`` asks for the log as it is."""

from __future__ import annotations

import io

from manta import Client
from manta.follow import LogSink, StatusLine
from manta.terminal import escape_controls
from rich.console import Console

from jobs import state
from tests.conftest import SYSTEM
from tests.jobs.conftest import submit as submit_job

from .test_follow import start_attempt, write_log

# An OSC 52 clipboard write, a screen clear, a carriage return that rewrites the line, a NUL,
# a one-character C1 CSI, a window title and DEL.
HOSTILE = (
    "copy \x1b]52;c;ZWNobyBwd25lZA==\x07 clear \x1b[2J fake\rline nul\x00 csi\x9b31m "
    "title \x1b]0;owned\x1b\\ del\x7f end\n"
)
SHOWN = (
    "copy \\x1b]52;c;ZWNobyBwd25lZA==\\x07 clear \\x1b[2J fake\\x0dline nul\\x00 csi\\x9b31m "
    "title \\x1b]0;owned\\x1b\\ del\\x7f end\n"
)
# PostgreSQL stores no NUL: what the server keeps of a log (and these tests write) has none.
STORED, STORED_SHOWN = HOSTILE.replace(" nul\x00", ""), SHOWN.replace(" nul\\x00", "")


def test_control_characters_are_escaped_and_text_is_kept():
    assert escape_controls(HOSTILE) == SHOWN
    kept = "tabs\tand newlines\nand CRLF line ends\r\nünïcödé, emoji 🚀, backslashes \\x1b\n"
    assert escape_controls(kept) == kept
    assert escape_controls("progress 10%\rprogress 20%\r") == "progress 10%\\x0dprogress 20%\\x0d"
    every = "".join(map(chr, range(0xA0)))
    assert all(c in "\t\n" or c.isprintable() for c in escape_controls(every))


def ended_job_with_log(live_world, counter, log: str, to_state: str = "succeeded", **fields):
    job = submit_job(live_world, counter)
    attempt = start_attempt(job, 1, "")
    write_log(attempt, log, torn_down=True)
    state.transition(
        job.pk,
        to_state,
        actor=SYSTEM,
        mutate=lambda j: [setattr(j, name, value) for name, value in fields.items()],
    )
    return job


def test_jobs_logs_escapes_the_log_and_raw_passes_it(manta, live_world, counter):
    job = ended_job_with_log(live_world, counter, STORED)

    shown = manta.as_user("developer", "jobs", "logs", str(job.pk))
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == STORED_SHOWN
    assert "\x1b" not in shown.stdout and "\x9b" not in shown.stdout

    raw = manta.as_user("developer", "jobs", "logs", str(job.pk), "--raw")
    assert raw.exit_code == 0 and raw.stdout == STORED

    # Following prints the same, escaped or raw.
    followed = manta.as_user("developer", "jobs", "logs", str(job.pk), "-f")
    assert followed.exit_code == 0 and followed.stdout == STORED_SHOWN
    followed_raw = manta.as_user("developer", "jobs", "logs", str(job.pk), "-f", "--raw")
    assert followed_raw.exit_code == 0 and followed_raw.stdout == STORED


def test_a_live_log_with_a_nul_is_escaped_too(manta, live_world, counter, monkeypatch):
    # A live log comes from the cluster, not the database: it may hold a NUL.
    job = ended_job_with_log(live_world, counter, "")
    body = {"attempt": 1, "source": "live", "logs": HOSTILE, "offset": len(HOSTILE)}
    monkeypatch.setattr(Client, "job_logs", lambda self, job_id, **options: body)
    shown = manta.as_user("developer", "jobs", "logs", str(job.pk))
    assert shown.exit_code == 0 and shown.stdout == SHOWN
    raw = manta.as_user("developer", "jobs", "logs", str(job.pk), "--raw")
    assert raw.exit_code == 0 and raw.stdout == HOSTILE


def test_a_failure_message_is_escaped_wherever_it_is_shown(manta, live_world, counter):
    job = ended_job_with_log(
        live_world, counter, "", to_state="failed", failure_reason="crashed", message=STORED
    )
    followed = manta.as_user("developer", "jobs", "logs", str(job.pk), "-f", "--raw")
    assert followed.exit_code == 1
    # --raw is about the log: how the job ended is the server's text and stays escaped.
    assert "\\x1b]52;c;" in followed.stderr and "\x1b" not in followed.stderr
    shown = manta.as_user("developer", "jobs", "get", str(job.pk))
    assert shown.exit_code == 0, shown.output
    assert "\\x1b[2J" in shown.stdout and "\x1b" not in shown.stdout and "\x9b" not in shown.stdout


def test_a_followed_log_above_a_live_status_line_is_escaped_too():
    terminal = io.StringIO()
    status = StatusLine(1, Console(file=terminal, force_terminal=True))
    sink = LogSink(terminal, status)
    with status:
        sink.write(HOSTILE)
        sink.flush()
    # Rich draws the status line with escape sequences of its own; the job's are shown escaped.
    drawn = terminal.getvalue()
    assert "\\x1b]52;c;" in drawn and "\x1b]52;" not in drawn and "\x9b" not in drawn
    assert "\x1b[2J" not in drawn and "\x1b]0;" not in drawn


def test_a_log_split_across_reads_keeps_its_crlf_and_escapes_a_lone_cr():
    out = io.StringIO()
    sink = LogSink(out)
    for chunk in ("one\r", "\ntwo\rthree", "\r\n", "four\x1b", "[2J\n"):
        sink.write(chunk)
    sink.flush()
    assert out.getvalue() == "one\r\ntwo\\x0dthree\r\nfour\\x1b[2J\n"
