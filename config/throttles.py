"""Request throttles: logins per client address and per account, token issuance per account, job
submissions per user and per workspace, code package uploads per user.

DRF's ``SimpleRateThrottle`` over Django's default cache, which every API process shares (Redis in
production, see ``CACHES`` in config/settings.py); rates come from
``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` by scope. Each key holds the times of the requests
counted in its window, newest first. On Redis the whole check (drop what left the window, refuse
or count this request) is one Lua script: atomic in Redis, and one round trip per throttle. On
other caches DRF reads the history, then writes it back: concurrent requests would each count
against the history they read and slip past the limit, so each key's read and write happen under
a lock (:func:`counted_alone`). A refused request answers 429 ``throttled`` with ``Retry-After``
(config/errors.py keeps DRF's header).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import logging
import re
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.filebased import FileBasedCache
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from redis.exceptions import RedisError
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

logger = logging.getLogger(__name__)

# "count/period": the period one of DRF's units, optionally a multiple of it ("500/30m").
# config/settings.py checks the MANTA_THROTTLE_* variables against the same grammar at start.
RATE = re.compile(r"(\d+)/(\d*)(s|sec|second|m|min|minute|h|hour|d|day)")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """``"500/30m"`` → ``(500, 1800)``; DRF's own forms (``"10/min"``, ``"100/day"``) too."""
    match = RATE.fullmatch(rate.strip().lower())
    count, periods = (int(match[1]), int(match[2] or 1)) if match else (0, 0)
    if count < 1 or periods < 1:
        raise ImproperlyConfigured(
            f"throttle rate {rate!r}: use count/period, e.g. 10/min, 500/30m"
        )
    return count, periods * UNIT_SECONDS[match[3][0]]


def digest(value: str) -> str:
    """A fixed-length cache key part for a value a client chose (an email, a header)."""
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def client_address(ident: str | None) -> str:
    """What a client is counted as: its IPv4 address, or its IPv6 /64 (one host usually holds a
    whole /64, and would otherwise get a fresh count for every address in it)."""
    try:
        address = ipaddress.ip_address((ident or "").strip())
    except ValueError:
        return digest(ident or "")
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


FILE_LOCK_STRIPES = 64  # lock files of the file cache: keys share them, a bounded number
_in_process = threading.Lock()

# The check on Redis, in one atomic step. KEYS[1]: the key's list of request times, newest
# first; ARGV: now, the window in seconds, the number of requests it allows. Drops the times
# that left the window (the oldest are at the tail); when the window is full, answers the
# num_requests-th newest time (when the next request will be allowed follows from it);
# otherwise counts this request and keeps the list for one window. The same steps as DRF's.
SLIDING_WINDOW = """
local key, now = KEYS[1], tonumber(ARGV[1])
local duration, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local oldest = redis.call('LINDEX', key, -1)
while oldest and tonumber(oldest) <= now - duration do
  redis.call('RPOP', key)
  oldest = redis.call('LINDEX', key, -1)
end
if redis.call('LLEN', key) >= limit then
  return redis.call('LINDEX', key, limit - 1)
end
redis.call('LPUSH', key, ARGV[1])
redis.call('EXPIRE', key, duration)
return false
"""
# Beside the key DRF's pickled history used, so a value left by an older release is no list.
REDIS_KEY_SUFFIX = ":window"


@contextlib.contextmanager
def counted_alone(cache: BaseCache, key: str) -> Iterator[None]:
    """Hold ``key``'s throttle lock, across every process sharing ``cache``: an flock on one of
    the file cache's lock files, or (a per-process cache) a thread lock. (Redis needs none: its
    check is one script.)"""
    if isinstance(cache, FileBasedCache):
        stripe = int(hashlib.sha256(key.encode()).hexdigest(), 16) % FILE_LOCK_STRIPES
        path = Path(cache._dir) / f"throttle-{stripe}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield  # closing the file releases the lock
    else:
        with _in_process:
            yield


class RateThrottle(SimpleRateThrottle):
    """``SimpleRateThrottle`` with the rate read when the throttle is made (DRF's class attribute
    is read once, at import), periods such as ``30m``, an empty rate meaning off, a ``wait()``
    that always answers, and a cache outage letting requests through rather than failing them."""

    def get_rate(self) -> str | None:
        try:
            return api_settings.DEFAULT_THROTTLE_RATES[self.scope] or None
        except KeyError:
            raise ImproperlyConfigured(f"no throttle rate for scope {self.scope!r}") from None

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        return (None, None) if rate is None else parse_rate(rate)

    @property
    def cache(self) -> BaseCache:
        # The backend itself: DRF's ``cache`` is Django's proxy to it, which isinstance() does
        # not see through (the lock a backend needs is chosen by its class).
        return caches[DEFAULT_CACHE_ALIAS]

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        cache = self.cache
        try:
            if isinstance(cache, RedisCache):
                return self.allow_in_redis(cache, key)
            with counted_alone(cache, key):
                return super().allow_request(request, view)
        except (RedisError, DatabaseError, OSError):
            # Login and submission matter more than their limits while the cache is away.
            logger.warning(
                "throttle %s: cache unavailable, not counting", self.scope, exc_info=True
            )
            return True

    def allow_in_redis(self, cache: RedisCache, key: str) -> bool:
        """DRF's check as one script (:data:`SLIDING_WINDOW`) on the key's Redis server."""
        self.now = self.timer()
        refused_at = _window_script(cache, key)(
            keys=[cache.make_and_validate_key(key) + REDIS_KEY_SUFFIX],
            args=[repr(self.now), self.duration, self.num_requests],
        )
        if refused_at is None:
            return True
        self.oldest_counted = float(refused_at)
        return False

    def throttle_failure(self) -> bool:
        # Refused: the history holds at least num_requests entries, newest first. The next
        # request is allowed when the num_requests-th newest has aged out of the window.
        self.oldest_counted = self.history[self.num_requests - 1]
        return False

    def wait(self) -> float:
        # (DRF's own answer is None when the history holds more than num_requests, e.g. after a
        # rate was lowered: no Retry-After.)
        return max(1.0, self.duration - (self.now - self.oldest_counted))


# The script bound to a client of the cache's Redis, per cache client (one per thread): Django
# makes a new redis-py client for every operation, and each one builds its ~170 response
# callbacks (0.4 ms, twice per submission).
_WINDOW_SCRIPTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _window_script(cache: RedisCache, key: str):
    backend = cache._cache
    script = _WINDOW_SCRIPTS.get(backend)
    if script is None:
        script = backend.get_client(key, write=True).register_script(SLIDING_WINDOW)
        _WINDOW_SCRIPTS[backend] = script
    return script


class LoginIPThrottle(RateThrottle):
    """Token requests (logins) per client address: ``REMOTE_ADDR``, or, when the operator says
    how many proxies are in front (``NUM_PROXIES``), the address they recorded in
    X-Forwarded-For. Every attempt counts, right or wrong."""

    scope = "login_ip"

    def get_cache_key(self, request, view) -> str:
        ident = client_address(self.get_ident(request))
        return self.cache_format % {"scope": self.scope, "ident": ident}


class LoginAccountThrottle(RateThrottle):
    """Token requests (logins) per account: the email in the body, trimmed and lower-cased, from
    any address. A body without an email is left to the address throttle (and the view's 400)."""

    scope = "login_account"

    def account(self, request) -> object:
        """The account the request signs in as, as the client sent it."""
        return request.data.get("email") if isinstance(request.data, Mapping) else None

    def get_cache_key(self, request, view) -> str | None:
        email = self.account(request)
        if not isinstance(email, str) or not email.strip():
            return None
        return self.cache_format % {"scope": self.scope, "ident": digest(email.strip().lower())}


class TokenIssueThrottle(LoginAccountThrottle):
    """Token requests per user over a longer window than the login throttles: bounds the tokens
    one account can mint. Issuing a token is the login, so the user is the account named in the
    body, and a wrong password counts too (the throttle runs before the password is checked)."""

    scope = "tokens"


class SubmitUserThrottle(RateThrottle):
    """Job submissions per user, over all their workspaces."""

    scope = "submit_user"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


class SubmitWorkspaceThrottle(RateThrottle):
    """Job submissions per workspace, whoever submits. Keyed on the workspace the tenant view
    resolved, so it must run after that (:class:`ThrottledViewMixin`)."""

    scope = "submit_workspace"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": view.workspace.pk}


class PackageUploadThrottle(RateThrottle):
    """Code package uploads per user, over all their workspaces: each is up to
    MANTA_PACKAGE_MAX_BYTES read, hashed, checked and stored, whatever the storage quota then
    says. Every upload counts, content the workspace already holds too."""

    scope = "package_upload"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


class ThrottledViewMixin:
    """Throttles per action (``throttle_map``, like the tenant views' ``permission_map``; an action
    not in it has none), run after everything else ``initial()`` checks and stopping at the first
    refusal.

    After: a request the view would refuse anyway (401, a workspace the caller cannot see, a
    missing permission) counts against nobody's limit, so a stranger cannot use up a workspace's
    submissions, and a throttle can key on what ``initial()`` resolved. First refusal: a user over
    their own limit does not use up their workspace's, nor one address over its limit an
    account's."""

    throttle_map: dict[str, list[type[RateThrottle]]] = {}
    _throttles_deferred = False

    def get_throttles(self):
        action = getattr(self, "action", None)
        return [throttle() for throttle in self.throttle_map.get(action, [])]

    def initial(self, request, *args, **kwargs):
        self._throttles_deferred = True
        try:
            super().initial(request, *args, **kwargs)
        finally:
            self._throttles_deferred = False
        self.check_throttles(request)

    def check_throttles(self, request):
        if self._throttles_deferred:
            return
        for throttle in self.get_throttles():
            if not throttle.allow_request(request, self):
                self.throttled(request, throttle.wait())
