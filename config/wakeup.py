"""Wake-ups that coalesce: one message waiting is enough for a task whose message says only
"look again" (the admission pass over every organisation, the outbox dispatcher).

A commit that needs the task calls :func:`wake`, which sends only when no wake-up of that name
is pending (and marks one pending). The task calls :func:`woken` first thing, before it reads
anything, so a commit that found a wake-up pending (and sent nothing) has committed before the
run that wake-up starts reads: that run sees it. A burst of commits while the worker is busy
then costs one message and one run, not one of each per commit.

The mark lives in the cache when it is Redis (``MANTA_CACHE_URL``, by default the broker's Redis:
one the API and the workers share) and expires after :data:`PENDING_SECONDS`: a message lost on
its way (a broker restarted without persistence) delays the next wake-up by at most that long,
and the sweeps look again anyway. With another cache (the file cache of a RabbitMQ deployment,
which hosts need not share: a worker could never clear an API host's mark), every commit sends,
as before. So it does while Redis is away: a mark that gets no answer within :data:`ANSWER_SECONDS`
sends, and this process then sends without asking for :data:`PENDING_SECONDS` (a hung Redis
would otherwise cost every request a wait per wake-up on top of the broker's own).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.redis import RedisCache
from redis.exceptions import RedisError

from config.metrics import WAKEUPS

logger = logging.getLogger(__name__)

PENDING_SECONDS = 5
ANSWER_SECONDS = 0.25  # a mark is one SET, answered in well under a millisecond

# A client per Redis URL, with short timeouts of its own (the cache's are for the throttles):
# should the mark not be answered in time, the wake-up is sent, which is always safe.
_CLIENTS: dict[str, redis.Redis] = {}
_away_until = 0.0  # monotonic time until which this process does not ask a Redis that was away


def _redis(cache: RedisCache) -> redis.Redis:
    url = cache._servers[0]  # the primary: where the cache writes
    client = _CLIENTS.get(url)
    if client is None:
        client = _CLIENTS[url] = redis.Redis.from_url(
            url, socket_timeout=ANSWER_SECONDS, socket_connect_timeout=ANSWER_SECONDS
        )
    return client


def _key(cache: RedisCache, name: str) -> str:
    return cache.make_and_validate_key(f"wakeup:{name}")


def wake(name: str, send: Callable[[], object]) -> bool:
    """Call ``send`` unless a wake-up of ``name`` is pending; True when it was called. Should
    sending fail, nothing stays pending."""
    marked = _mark(name)
    if marked is False:
        WAKEUPS.labels(task=name, outcome="pending").inc()
        return False
    try:
        send()
    except Exception:
        if marked:
            woken(name)
        raise
    WAKEUPS.labels(task=name, outcome="sent").inc()
    return True


def _mark(name: str) -> bool | None:
    """True when no wake-up of ``name`` was pending (and one is now), False when one was, None
    when there is nowhere to keep the mark (send, keep nothing)."""
    global _away_until
    cache = caches[DEFAULT_CACHE_ALIAS]
    if not isinstance(cache, RedisCache) or time.monotonic() < _away_until:
        return None
    key = _key(cache, name)
    try:
        return bool(_redis(cache).set(key, b"1", nx=True, ex=PENDING_SECONDS))
    except (RedisError, OSError):
        _away_until = time.monotonic() + PENDING_SECONDS
        logger.warning("wake-up %s: the cache did not answer, sending", name, exc_info=True)
        return None


def woken(name: str) -> None:
    """A run of ``name`` starts: the next commit that needs one sends a new wake-up."""
    cache = caches[DEFAULT_CACHE_ALIAS]
    if not isinstance(cache, RedisCache):
        return
    try:
        _redis(cache).delete(_key(cache, name))
    except (RedisError, OSError):
        logger.warning("wake-up %s: the cache did not answer", name, exc_info=True)
