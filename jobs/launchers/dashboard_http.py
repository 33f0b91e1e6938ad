"""One bounded HTTP exchange with a cluster's dashboard.

A job can replace its cluster's dashboard with a server of its own (it runs as the job's user),
so every answer is a tenant's. What :func:`exchange` promises, whatever the server does:

* a total deadline: connecting, sending, the status line, the headers and the body all end
  within ``timeout`` seconds. A watchdog shuts the socket down at the deadline, so a server that
  drips one byte at a time is cut off like one that says nothing.
* no redirects: a 3xx answer is an error naming its status, and its ``Location`` is never
  contacted.
* at most ``limit`` bytes of body, read in chunks: a longer answer (by its Content-Length or by
  what arrives) is an error, and what was read of it is dropped.
* nothing from this process's environment decides where a request goes (no proxies, no
  ``.netrc``), and no compressed answers are asked for.

Errors are :class:`DashboardError`, a LaunchError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

from .base import LaunchError

MIB = 1024**2
DEFAULT_TIMEOUT = 30.0
ANSWER_LIMIT = 8 * MIB  # a JSON answer of the Jobs API
CHUNK = 65536


class DashboardError(LaunchError):
    """The dashboard did not give a usable answer in time."""


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


class _Watchdog:
    """Shuts a socket down at the deadline, which ends any read or write blocked on it."""

    def __init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shut()

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            # The plain socket's shutdown, also for TLS: it only has to wake the reader.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)


def exchange(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    limit: int = ANSWER_LIMIT,
    verify: bool | str = True,
) -> Answer:
    """Send one request to ``url`` and return the answer (any status but 3xx), or raise
    DashboardError: see the module's docstring."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DashboardError(f"not a dashboard address: {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    where = f"{method} {parts.scheme}://{parts.netloc}{parts.path}"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    watchdog = _Watchdog(timeout)
    sock: socket.socket | None = None
    connection: http.client.HTTPConnection | None = None
    try:
        sock = _connect(parts.hostname, port, watchdog)
        if parts.scheme == "https":
            sock = _context(verify).wrap_socket(
                sock, server_hostname=parts.hostname, do_handshake_on_connect=False
            )
            watchdog.watch(sock)
            sock.do_handshake()
        connection = http.client.HTTPConnection(parts.hostname, port)
        connection.sock = sock
        sent = {"Accept-Encoding": "identity", **(headers or {})}
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        if 300 <= response.status < 400:
            location = (response.getheader("Location") or "")[:200]
            raise DashboardError(
                f"{where} answered {response.status} {response.reason[:100]} (a redirect to "
                f"{location!r}): redirects are not followed"
            )
        length = response.getheader("Content-Length") or ""
        if length.strip().isdigit() and int(length) > limit:
            raise DashboardError(
                f"{where}: the answer is {int(length)} bytes, more than the {limit} allowed"
            )
        received = bytearray()
        while chunk := response.read1(CHUNK):
            received += chunk
            if len(received) > limit:
                raise DashboardError(f"{where}: the answer is longer than the {limit} allowed")
        if watchdog.expired:
            raise DashboardError(f"{where}: no complete answer within {timeout:g} s")
        return Answer(
            status=response.status,
            reason=response.reason,
            headers={k.lower(): v for k, v in response.getheaders()},
            body=bytes(received),
        )
    except DashboardError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if watchdog.expired:
            raise DashboardError(f"{where}: no complete answer within {timeout:g} s") from exc
        raise DashboardError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        watchdog.cancel()
        if connection is not None:
            connection.close()
        if sock is not None:
            sock.close()


def _connect(host: str, port: int, watchdog: _Watchdog) -> socket.socket:
    """A socket connected to the first of the host's addresses that answers before the
    deadline, watched by the watchdog from then on."""
    error: OSError = OSError(f"{host} has no address")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        left = watchdog.left()
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        watchdog.watch(sock)
        return sock
    if watchdog.left() <= 0:
        watchdog.expired = True
    raise error


def _context(verify: bool | str) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):  # a CA bundle, or a directory of them, as requests takes it
        if os.path.isdir(verify):
            return ssl.create_default_context(capath=verify)
        return ssl.create_default_context(cafile=verify)
    return ssl.create_default_context()
