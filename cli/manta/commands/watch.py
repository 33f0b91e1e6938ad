"""Following a job from the command line until it ends, and what Ctrl-C does meanwhile."""

from __future__ import annotations

import sys

import typer

from .. import output
from ..client import Client
from ..follow import LogFollower, LogSink, StatusLine, describe, follow, status_console
from ..responses import Job
from .common import EXIT_FAILED, EXIT_INTERRUPTED, State, info, poll_seconds


def follow_until_done(
    client: Client, job: Job, state: State, *, offer_cancel: bool, raw: bool = False
) -> Job:
    """Show the job's state and stream its log until it ends; the ended job. Ctrl-C stops
    following (exit 130), after asking whether to cancel the job when ``offer_cancel``.
    With JSON output the log goes to stderr, so stdout holds only the final job. The log's
    control characters are escaped unless ``raw``."""
    log_out = sys.stderr if state.as_json else sys.stdout
    status = StatusLine(job["id"], status_console(log_out))
    sink = LogSink(log_out, status, raw=raw)
    try:
        with status:
            return follow(
                client,
                job["id"],
                status=status,
                logs=LogFollower(client, job["id"], sink),
                interval=poll_seconds(),
            )
    except KeyboardInterrupt:
        status.stop()
        sink.flush()
        if offer_cancel and ask(f"Cancel job {job['id']}? [y/N] "):
            client.cancel_job(job["id"], reason="cancelled with Ctrl-C in the manta CLI")
            info(f"job {job['id']} cancelled")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def ask(question: str) -> bool:
    """A yes/no question on stderr; anything but yes (an empty line, no input, another Ctrl-C)
    is no."""
    sys.stderr.write(question)
    sys.stderr.flush()
    try:
        answer = sys.stdin.readline()
    except (KeyboardInterrupt, EOFError, OSError, ValueError):
        sys.stderr.write("\n")
        return False
    return answer.strip().lower() in ("y", "yes")


def finish(state: State, job: Job) -> None:
    """Say how the followed job ended; exit 0 only if it succeeded."""
    if state.as_json:
        output.print_json(job)
    else:
        info(f"job {job['id']} {describe(job)}")
    if job.get("state") != "succeeded":
        raise typer.Exit(EXIT_FAILED)
