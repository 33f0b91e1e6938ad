"""A job's driver log, live from Ray while its cluster is up and from Manta's archive after."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from .attempts import handle_of
from .launch_requests import resolve_target
from .launchers import launcher_for, ray_jobs
from .launchers.base import (
    LaunchError,
)
from .models import ATTEMPT_ACTIVE, TERMINAL_STATES, Job

FOLLOW_WAIT_SECONDS = 600  # how long a follower waits for a launch or for the archive


def job_log_stream(job: Job, *, number: int | None = None, since: int = 0) -> Iterator[str]:
    """The driver log of an attempt (the latest by default) from ``since`` on, as it grows,
    until the attempt ends: live from Ray chunk by chunk (nothing is read whole), then what
    the archive holds beyond it once written."""
    deadline = time.monotonic() + FOLLOW_WAIT_SECONDS
    attempts = job.attempts.order_by("-number")
    attempt = attempts.filter(number=number).first() if number else attempts.first()
    while attempt is None and number is None and time.monotonic() < deadline:
        # a job waiting for approval or admission: its first attempt's log is what comes next
        if Job.objects.filter(pk=job.pk, state__in=TERMINAL_STATES).exists():
            return
        time.sleep(0.5)
        attempt = attempts.first()
    if attempt is None:
        return
    while not attempt.submitted and attempt.state in ATTEMPT_ACTIVE:
        if time.monotonic() > deadline:
            return
        time.sleep(0.5)  # its cluster is starting
        attempt.refresh_from_db()
    position = 0
    if attempt.submitted and attempt.torn_down_at is None:
        target = resolve_target(job)
        launcher = launcher_for(target.kind, target.config)
        try:
            for chunk in launcher.follow_logs(handle_of(attempt)):
                fresh = chunk[max(0, since - position) :]
                position += len(chunk)
                if fresh:
                    yield fresh
        except LaunchError:
            pass  # the cluster went away: the archive has the rest
        while attempt.torn_down_at is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the end of the attempt writes the archive
            attempt.refresh_from_db()
    begin = max(position, since)
    text, start = attempt.log_archive, attempt.log_start
    if begin < start + len(text):
        yield text[max(0, begin - start) :]


def job_logs(
    job: Job, *, number: int | None = None, tail: int | None = None, since: int | None = None
) -> dict[str, Any]:
    """The driver log of an attempt (the latest by default): from Ray while its cluster is up
    (``live``), from Manta's copy once it is torn down (``archive``, written before the
    switch). While live, Manta's copy answers when Ray cannot, so lines never disappear.

    ``offset`` is where the text ends in the whole log; ``since`` (a previous answer's
    offset) returns only what came after it, so a follower never prints a line twice."""
    attempts = job.attempts.order_by("-number")
    attempt = attempts.filter(number=number).first() if number else attempts.first()
    if attempt is None:
        return {"attempt": None, "source": "none", "logs": "", "offset": 0}
    text, start, source = attempt.log_archive, attempt.log_start, "archive"
    if attempt.submitted and attempt.torn_down_at is None:
        source = "live"
        target = resolve_target(job)
        try:
            live = launcher_for(target.kind, target.config).logs(handle_of(attempt))
        except LaunchError:
            live = ""  # the cluster is not answering: Manta's copy is what there is
        if len(live) >= start + len(text):
            text, start = live, 0
    end = start + len(text)
    if since is not None:
        text = text[max(0, since - start) :] if since < end else ""
    elif tail:
        text = ray_jobs.tail_lines(text, tail)
    return {"attempt": attempt.number, "source": source, "logs": text, "offset": end}
