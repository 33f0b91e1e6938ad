"""A job's driver log, live from its cluster while it is up and from Manta's archive after.

Offsets (``offset``, ``since``) are positions in the whole log counted in bytes, the bytes the
driver wrote, live and in the archive alike: each byte that is not text (a NUL, invalid UTF-8)
is shown as one U+FFFD and counts one (see ``launchers.cluster_text``). An answer holds at most
MANTA_LOG_ARCHIVE_BYTES of the log, read from the cluster by range (from ``since``) or from the
log's end, never the whole log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings

from .attempts import handle_of
from .launch_requests import resolve_target
from .launchers import cluster_text, launcher_for, ray_jobs
from .launchers.base import LaunchError, LogPart
from .log_archive import log_archived
from .models import ATTEMPT_ACTIVE, TERMINAL_STATES, Job

FOLLOW_WAIT_SECONDS = 600  # how long a follower waits for a launch or for the archive


def job_log_stream(job: Job, *, number: int | None = None, since: int = 0) -> Iterator[str]:
    """The driver log of an attempt (the latest by default) from byte ``since`` on, as it
    grows, until the attempt ends: live from the cluster chunk by chunk (nothing is read
    whole), then what the archive holds beyond it once written."""
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
                fresh = cluster_text.skip(chunk, since - position)
                position += cluster_text.width(chunk)
                if fresh:
                    yield fresh
        except LaunchError:
            pass  # the cluster went away: the archive has the rest
        while attempt.torn_down_at is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the end of the attempt writes the archive
            attempt.refresh_from_db()
    begin = max(position, since)
    archived, head = log_archived(attempt)
    if begin < archived.end:
        yield (head if begin < archived.start else "") + cluster_text.skip(
            archived.text, begin - archived.start
        )


def job_logs(
    job: Job, *, number: int | None = None, tail: int | None = None, since: int | None = None
) -> dict[str, Any]:
    """The driver log of an attempt (the latest by default): from its cluster while it is up
    (``live``), from Manta's copy once it is torn down (``archive``, written before the
    switch). While live, Manta's copy answers when the cluster cannot, so lines never
    disappear.

    ``offset`` is where the text ends in the whole log (in bytes); ``since`` (a previous
    answer's offset) returns only what came after it, so a follower never prints a line
    twice. An answer holds at most MANTA_LOG_ARCHIVE_BYTES of the log: from ``since`` on
    (a follower behind by more catches up over several answers), else the log's end. Text
    before what an answer can give (dropped from the archive, or not in this answer) is
    announced by a ``[manta: …]`` line at its start."""
    attempts = job.attempts.order_by("-number")
    attempt = attempts.filter(number=number).first() if number else attempts.first()
    if attempt is None:
        return {"attempt": None, "source": "none", "logs": "", "offset": 0}
    part, head = log_archived(attempt)
    source = "archive"
    if attempt.submitted and attempt.torn_down_at is None:
        source = "live"
        target = resolve_target(job)
        launcher = launcher_for(target.kind, target.config)
        try:
            live = launcher.log_part(
                handle_of(attempt), since=since, limit=settings.MANTA_LOG_ARCHIVE_BYTES
            )
        except LaunchError:
            live = None  # the cluster is not answering: Manta's copy is what there is
        if live is not None and _reaches_further(live, part, since):
            part, head = live, _not_in_answer(live.start) if live.start else ""
    text = part.text
    if since is not None:
        text = cluster_text.skip(text, since - part.start) if since < part.end else ""
        head = head if since < part.start else ""
    elif tail:
        text, head = ray_jobs.tail_lines(text, tail), ""
    return {"attempt": attempt.number, "source": source, "logs": head + text, "offset": part.end}


def _reaches_further(live: LogPart, archived: LogPart, since: int | None) -> bool:
    """Whether the live part answers better than the archive: from ``since``, the one that
    starts nearer to it (no gap), then the longer; without, the one that ends later."""
    if since is None:
        return live.end >= archived.end

    def gap(part: LogPart) -> int:
        return max(0, part.start - since)

    return (gap(live), -live.end) <= (gap(archived), -archived.end)


def _not_in_answer(start: int) -> str:
    return (
        f"[manta: the first {start} bytes of this log are not in this answer; "
        "ask with since= for them]\n"
    )
