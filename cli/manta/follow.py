"""Following a job until it ends: its state as one status line, its driver log as it grows."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from .client import Client
from .errors import ApiError, ConnectionFailed
from .responses import TERMINAL_STATES, Attempt, Job
from .terminal import escape_controls

# How long a follower waits for a server that stopped answering before it gives up.
OUTAGE_SECONDS = 300.0


def describe(job: Job) -> str:
    """What the job is doing, or waiting for, in a few words; control characters in what the
    job and Ray said (a failure message, a reason) escaped."""
    return escape_controls(_describe(job))


def _describe(job: Job) -> str:
    state = job.get("state", "")
    attempts = job.get("attempts") or []
    attempt: Attempt = attempts[-1] if attempts else {}
    if state == "pending_approval":
        return f"pending approval: {job.get('approval_reason') or 'an admin must approve it'}"
    if state == "queued":
        queue = job.get("queue") or {}
        where = f" (position {queue.get('position')} of {queue.get('queued')})" if queue else ""
        why = queue.get("waiting_for") or "waiting for the next admission pass"
        return f"queued{where}: {why}"
    if state == "launching":
        number = attempt.get("number", 1)
        if not attempt.get("launch_started_at"):
            step = "waiting for a worker to take it"
        elif not attempt.get("cluster_ready_at"):
            step = f"starting Ray cluster {attempt.get('cluster_name', '')}".rstrip()
        elif not attempt.get("submitted_at"):
            step = "submitting the entrypoint"
        else:
            step = "starting the driver"
        return f"launching (attempt {number}): {step}"
    if state == "running":
        parts = [f"attempt {attempt.get('number', 1)}"]
        if attempt.get("dashboard_url"):
            parts.append(f"dashboard {attempt['dashboard_url']}")
        return f"running ({', '.join(parts)})"
    if state == "preempting":
        return (
            f"preempting (attempt {attempt.get('number', 1)}): the driver was sent SIGTERM; "
            "its cluster goes when it exits or the grace period ends, then it queues again"
        )
    if state == "failed":
        exit_code = attempt.get("exit_code")
        reasons = [
            job.get("failure_reason") or attempt.get("failure_reason") or "",
            f"exit code {exit_code}" if exit_code is not None else "",
            job.get("message") or "",
        ]
        return ": ".join(["failed", ", ".join(r for r in reasons if r)]).rstrip(": ")
    if state in ("rejected", "cancelled") and job.get("decision_reason"):
        return f"{state}: {job['decision_reason']}"
    return state


class StatusLine:
    """A live status line (spinner, state, elapsed time) on a terminal; elsewhere one plain line
    per change, so a CI log reads as a history."""

    def __init__(self, job_id: int, console: Console):
        self.job_id = job_id
        self.console = console
        self.started = time.monotonic()
        self.last = ""
        self._spinner = Spinner("dots")
        self._live: Live | None = None
        if console.is_terminal:
            self._live = Live(self._spinner, console=console, transient=True, refresh_per_second=8)

    def __enter__(self) -> StatusLine:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def is_live(self) -> bool:
        return self._live is not None

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, job: Job) -> None:
        text = describe(job)
        if self._live is not None:
            elapsed = int(time.monotonic() - self.started)
            clock = f"{elapsed // 60}:{elapsed % 60:02d}"
            self._spinner.update(text=Text(f"job {self.job_id} {text}  {clock}"))
        elif text != self.last:
            self.console.print(f"job {self.job_id}: {text}", markup=False, highlight=False)
        self.last = text

    def note(self, text: str) -> None:
        """Something about following itself (not the job), shown until the next update."""
        text = escape_controls(text)  # it may quote what the server answered
        if self._live is not None:
            self._spinner.update(text=Text(f"job {self.job_id}: {text}"))
        elif text != self.last:
            self.console.print(f"job {self.job_id}: {text}", markup=False, highlight=False)
        self.last = text

    def write_log(self, text: str) -> None:
        """Print log text above the status line (only whole lines reach here)."""
        self.console.print(Text.from_ansi(text), end="", soft_wrap=True, highlight=False)


class LogSink:
    """Where the driver log goes: to ``out``, or above the status line when that is on the same
    terminal. Text is passed on in whole lines, so a line is never split by the status, with its
    control characters escaped unless ``raw`` (the job wrote it: :mod:`manta.terminal`)."""

    def __init__(self, out: TextIO, status: StatusLine | None = None, *, raw: bool = False):
        self.out = out
        self.status = status
        self.raw = raw
        self._partial = ""
        self.ends_with_newline = True

    def write(self, text: str) -> None:
        if not text:
            return
        text = self._partial + text
        cut = text.rfind("\n") + 1
        self._partial = text[cut:]
        self._emit(text[:cut])

    def flush(self) -> None:
        """Pass on what is left of an unfinished line (at the end of an attempt)."""
        if self._partial:
            self._emit(self._partial + "\n")
            self._partial = ""

    def _emit(self, text: str) -> None:
        if not text:
            return
        if not self.raw:
            text = escape_controls(text)
        if self.status is not None and self.status.is_live:
            self.status.write_log(text)
        else:
            self.out.write(text)
            self.out.flush()
        self.ends_with_newline = text.endswith("\n")


class LogFollower:
    """Reads a job's driver log with ``since=<offset>`` so no text is printed twice; when a new
    attempt starts, finishes the old one's log, prints a separator and starts again from 0."""

    def __init__(self, client: Client, job_id: int, sink: LogSink):
        self.client = client
        self.job_id = job_id
        self.sink = sink
        self.attempt: int | None = None
        self.offset = 0

    def poll(self) -> None:
        body = self.client.job_logs(self.job_id, since=self.offset)
        number = body["attempt"]
        if number is None:
            return
        if self.attempt is not None and number != self.attempt:
            previous = self.client.job_logs(self.job_id, attempt=self.attempt, since=self.offset)
            self.sink.write(previous["logs"])
            self.sink.flush()
            self.sink.write(f"----- attempt {number} -----\n")
            # Moved on before reading the new attempt, so a failed read is not printed twice.
            self.attempt, self.offset = number, 0
            body = self.client.job_logs(self.job_id, attempt=number, since=0)
        self.attempt = number
        self.sink.write(body["logs"])
        self.offset = body["offset"]


def follow(
    client: Client,
    job_id: int,
    *,
    status: StatusLine,
    logs: LogFollower | None,
    interval: float,
    outage_seconds: float = OUTAGE_SECONDS,
) -> Job:
    """Poll the job (and its log) until it ends; the ended job. A server that stops answering
    for a while (a restart, a deploy) is waited for, up to ``outage_seconds``."""
    lost_since: float | None = None
    while True:
        try:
            job = client.job(job_id)
            status.update(job)
            if logs is not None and job.get("attempts"):
                logs.poll()
        except (ConnectionFailed, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status < 500:
                raise
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > outage_seconds:
                raise
            status.note(f"the server does not answer ({exc}); trying again")
            time.sleep(interval)
            continue
        lost_since = None
        if job.get("state") in TERMINAL_STATES:
            if logs is not None:
                logs.poll()  # what was written between the two reads
                logs.sink.flush()
            return job
        time.sleep(interval)


def status_console(log_out: TextIO) -> Console:
    """The console for the status line: the log's own terminal when it is one (the line then
    stays below the log), stderr otherwise, so a redirected log holds only the log."""
    if log_out.isatty():
        return Console(file=log_out)
    return Console(file=sys.stderr)
