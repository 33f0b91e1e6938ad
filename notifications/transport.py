"""One HTTP POST to a checked destination.

The connection goes to ``Destination.address`` (the address the SSRF guard checked), while the
``Host`` header, the TLS server name and the certificate check use the URL's host name. Redirects
are never followed; the response body is read only as far as the stored excerpt (plus a bounded
drain to keep the connection reusable), so a receiver cannot make a worker download a large body.
Connections are kept alive per destination within a worker process.
"""

from __future__ import annotations

import dataclasses
import email.utils
import time
from collections import OrderedDict

import urllib3
from django.utils import timezone

from .ssrf import Destination

EXCERPT_BYTES = 1024
DRAIN_LIMIT = 64 * 1024  # beyond this the connection is dropped instead of drained
USER_AGENT = "Manta-Webhooks/1.0"
MAX_POOLS = 128

_pools: OrderedDict[tuple, urllib3.HTTPConnectionPool] = OrderedDict()


@dataclasses.dataclass
class Outcome:
    status_code: int | None
    duration_ms: int
    excerpt: str = ""
    error: str = ""
    retry_after: float | None = None  # seconds, from a 429/503's Retry-After

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _pool(dest: Destination) -> urllib3.HTTPConnectionPool:
    key = (dest.scheme, dest.address, dest.port, dest.host)
    pool = _pools.get(key)
    if pool is not None:
        _pools.move_to_end(key)
        return pool
    if dest.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            dest.address,
            dest.port,
            maxsize=1,
            cert_reqs="CERT_REQUIRED",
            server_hostname=dest.host,
            assert_hostname=dest.host,
        )
    else:
        pool = urllib3.HTTPConnectionPool(dest.address, dest.port, maxsize=1)
    _pools[key] = pool
    while len(_pools) > MAX_POOLS:
        _pools.popitem(last=False)[1].close()
    return pool


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - timezone.now()).total_seconds())


def post(dest: Destination, body: bytes, headers: dict[str, str], timeout: float) -> Outcome:
    request_headers = {
        "Host": dest.host_header,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Accept-Encoding": "identity",
        **headers,
    }
    started = time.monotonic()
    try:
        response = _pool(dest).urlopen(
            "POST",
            dest.target,
            body=body,
            headers=request_headers,
            retries=False,
            redirect=False,
            assert_same_host=False,
            timeout=urllib3.Timeout(total=timeout),  # connect and read together
            preload_content=False,
            decode_content=False,
        )
    except urllib3.exceptions.HTTPError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        return Outcome(None, elapsed, error=_describe(exc))
    try:
        excerpt = response.read(EXCERPT_BYTES)
        drained = 0
        while drained <= DRAIN_LIMIT:
            chunk = response.read(16 * 1024)
            if not chunk:
                break
            drained += len(chunk)
        else:
            response.close()  # too much left: drop the connection rather than read it
    except urllib3.exceptions.HTTPError as exc:
        excerpt, error = b"", _describe(exc)
    else:
        error = ""
    finally:
        response.release_conn()
    elapsed = int((time.monotonic() - started) * 1000)
    status = response.status
    retry_after = (
        parse_retry_after(response.headers.get("Retry-After")) if status in (429, 503) else None
    )
    if 300 <= status < 400:
        location = response.headers.get("Location", "")
        error = f"redirect to {location[:200]!r} not followed" if location else "redirect"
    return Outcome(
        status,
        elapsed,
        excerpt=excerpt.decode("utf-8", errors="replace"),
        error=error,
        retry_after=retry_after,
    )


def _describe(exc: Exception) -> str:
    if isinstance(exc, urllib3.exceptions.NewConnectionError):  # (a TimeoutError subclass)
        return f"cannot connect: {exc}"[:500]
    if isinstance(exc, urllib3.exceptions.TimeoutError) or "timed out" in str(exc).lower():
        return "timed out"
    return f"{type(exc).__name__}: {exc}"[:500]
