"""A local cluster's logs on disk: each node's ``ray start`` output and the session logs of its
Ray processes (for start-up errors), and the driver log the head writes (the job's log, read
here rather than through the dashboard, and followed as it grows).

The driver log is the job's to fill: it is only ever read in bounded pieces, from its end or
from an offset (``seek``), never whole, so a log of any size (a sparse file of a few GB
included) costs a reader no more than the piece it asked for.

In a sandbox, every name below the cluster's ``s/`` is the tenant's to change and this process
reads as root: session files are opened without following a link, and only when the node's own
user owns them.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any

from .. import cluster_text, ray_jobs
from ..base import LogPart

FOLLOW_POLL = 0.2  # seconds between reads at the end of a followed driver log
FOLLOW_CHUNK = 65536

# How Ray reports a port someone else took between our check and its bind. `ray start` does not
# exit on it: a GCS that cannot bind dies while `ray start` waits for it forever, and a dashboard
# that cannot bind is skipped ("already occupied"), so we look for these in the node's logs.
RAY_STARTED = "Ray runtime started"
PORT_CONFLICT = re.compile(r"address already in use|already occupied|EADDRINUSE", re.IGNORECASE)


def _node_logs(node: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, end of text) of the node's `ray start` output, then of the .err files of the Ray
    processes it started."""
    logs = [(os.path.basename(node["log"]), read_end(node["log"]))]
    with _session_logs(node) as fd:
        if fd is not None:
            for name in sorted(n for n in os.listdir(fd) if n.endswith(".err")):
                logs.append((name, _read_session_file(node, fd, name) or ""))
    return logs


@contextlib.contextmanager
def _session_logs(node: dict[str, Any]):
    """A descriptor of the node's newest session log dir (None when there is none), reached
    without following a single link: in a sandbox, every name below the cluster's ``s/`` is
    the tenant's to change, and this process reads as root."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    parent, name = os.path.split(node["temp_dir"])
    opened: list[int] = []
    try:
        opened.append(os.open(parent, flags))  # the cluster's dir or its s/: made by us
        opened.append(os.open(name, flags, dir_fd=opened[-1]))
        sessions = sorted(n for n in os.listdir(opened[-1]) if n.startswith("session_2"))
        if not sessions:
            yield None
            return
        opened.append(os.open(sessions[-1], flags, dir_fd=opened[-1]))
        opened.append(os.open("logs", flags, dir_fd=opened[-1]))
        yield opened[-1]
    except OSError:
        yield None
    finally:
        for fd in opened:
            os.close(fd)


def _open_session_file(node: dict[str, Any], logs_fd: int, name: str):
    """A regular file in the node's session logs that the node's own user owns, opened for
    reading without following a link (None when there is none)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=logs_fd)
    except OSError:
        return None
    info = os.fstat(fd)
    owner = node.get("uid")
    if not stat.S_ISREG(info.st_mode) or (owner is not None and info.st_uid != owner):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _read_session_file(
    node: dict[str, Any], logs_fd: int, name: str, limit: int | None = 32768
) -> str | None:
    """The end of a regular file in the node's session logs that the node's own user owns."""
    f = _open_session_file(node, logs_fd, name)
    if f is None:
        return None
    with f:
        if limit is not None:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
        return f.read().decode(errors="replace")


def _open_driver_log(handle: dict[str, Any]):
    """The driver log the head node keeps on disk, opened (None when there is none yet)."""
    nodes = handle.get("nodes") or []
    if not nodes:
        return None
    with _session_logs(nodes[0]) as fd:
        if fd is None:
            return None
        return _open_session_file(nodes[0], fd, f"job-driver-{handle.get('submission_id')}.log")


def _read_range(f, begin: int, end: int) -> bytes:
    """Bytes ``begin``..``end`` of an open file (fewer when it ends first)."""
    f.seek(begin)
    pieces, left = [], end - begin
    while left > 0:
        piece = f.read(min(left, FOLLOW_CHUNK))
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def driver_log_part(handle: dict[str, Any], *, since: int | None, limit: int) -> LogPart | None:
    """At most ``limit`` bytes of the driver log the head keeps on disk, from byte ``since`` on
    when given, else its end (None when there is no such file yet)."""
    f = _open_driver_log(handle)
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        return cluster_text.read_part(size, since, limit, lambda a, b: _read_range(f, a, b))


def driver_log_lines(handle: dict[str, Any], lines: int, *, limit: int) -> str | None:
    """The last ``lines`` lines of the driver log on disk, read backwards from its end a chunk
    at a time until they are all in, but never more than its last ``limit`` bytes (None when
    there is no such file yet)."""
    f = _open_driver_log(handle)
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        begin, newlines, pieces = size, 0, []
        # One newline more than lines: the first line wanted starts after it.
        while begin > 0 and size - begin < limit and newlines <= lines:
            step = min(FOLLOW_CHUNK, begin, limit - (size - begin))
            begin -= step
            pieces.append(_read_range(f, begin, begin + step))
            newlines += pieces[-1].count(b"\n")
    data = b"".join(reversed(pieces))
    part = cluster_text.read_part(size, begin, len(data), lambda a, b: data[a - begin : b - begin])
    return ray_jobs.tail_lines(part.text, lines)


def follow_driver_log(handle: dict[str, Any], ended: Callable[[], bool]) -> Iterator[str]:
    """The driver log the head writes on this host, from its start, 64 KiB at a time, every
    FOLLOW_POLL seconds at its end (Ray's own tail polls once a second, through two hops).
    ``ended`` is asked at most once a second whether the job is over; once it is, what is left
    is read and the stream ends. The text is clean, and its pieces' widths add up to the bytes
    read (see ``cluster_text``)."""
    decoder = cluster_text.LogDecoder()
    log, over, asked = None, False, 0.0
    try:
        while True:
            log = log or _open_driver_log(handle)
            chunk = log.read(FOLLOW_CHUNK) if log is not None else b""
            if chunk:
                yield decoder.decode(chunk)
                continue
            if over:
                rest = decoder.decode(b"", final=True)
                if rest:
                    yield rest
                return
            if time.monotonic() - asked >= 1.0:
                asked = time.monotonic()
                over = ended()  # once the job ended, read what is left, then stop
                continue
            time.sleep(FOLLOW_POLL)
    finally:
        if log is not None:
            log.close()


def read_end(path: str, limit: int = 32768) -> str:
    """The last ``limit`` bytes of a file as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def port_conflict(node: dict[str, Any]) -> str | None:
    """Where the node's logs say it lost a port to someone else (None when they do not)."""
    for name, text in _node_logs(node):
        for line in text.splitlines():
            match = PORT_CONFLICT.search(line)
            if match:
                # gRPC's lines are long nested dumps; keep the part that names the port.
                excerpt = line[max(0, match.start() - 200) : match.end() + 20].strip()
                return f"{name}: ...{excerpt}"
    return None


def log_tail(node: dict[str, Any], lines: int = 40) -> str:
    """The end of the node's `ray start` output, plus any error logs of its Ray processes."""
    logs = _node_logs(node)
    parts = [ray_jobs.tail_lines(logs[0][1], lines)]
    # A Ray subprocess that dies (e.g. the GCS failing to bind) writes why to its own .err
    # file, not to `ray start`'s output.
    for name, text in logs[1:]:
        text = ray_jobs.tail_lines(text, 10).strip()[-1500:]
        if text:
            parts.append(f"--- {name} ---\n{text}\n")
    return "".join(parts)[-12000:]
