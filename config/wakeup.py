"""Wake-ups that coalesce: one message waiting is enough for a task whose message says only
"look again" (the admission pass over every organisation, the outbox dispatcher).

A commit that needs the task calls :func:`wake`, which sends only when no wake-up of that name
is pending (and marks one pending). The task calls :func:`woken` first thing,
before it reads anything, so a commit that found a wake-up pending (and sent nothing) has
committed before the run that wake-up starts reads: that run sees it. A burst of commits while
the worker is busy then costs one message and one run, not one of each per commit.

The mark lives in the cache when it is Redis (``MANTA_CACHE_URL``, by default the broker's Redis:
one the API and the workers share) and expires after :data:`PENDING_SECONDS`: a message lost on
its way (a broker restarted without persistence) delays the next wake-up by at most that long,
and the sweeps look again anyway. With another cache (the file cache of a RabbitMQ deployment,
which hosts need not share: a worker could never clear an API host's mark) or with Redis away,
every commit sends, as before.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.redis import RedisCache
from redis.exceptions import RedisError

from config.metrics import WAKEUPS

logger = logging.getLogger(__name__)

PENDING_SECONDS = 5

# A redis-py client per cache backend (one per thread): Django's cache makes a new client, with
# its ~170 response callbacks, for every operation.
_CLIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _key(name: str) -> str:
    return caches[DEFAULT_CACHE_ALIAS].make_and_validate_key(f"wakeup:{name}")


def _redis(cache: RedisCache, key: str):
    backend = cache._cache
    client = _CLIENTS.get(backend)
    if client is None:
        client = _CLIENTS[backend] = backend.get_client(key, write=True)
    return client


def wake(name: str, send: Callable[[], object]) -> bool:
    """Call ``send`` unless a wake-up of ``name`` is pending; True when it was called. Should
    sending fail, nothing stays pending."""
    if not _mark(name):
        WAKEUPS.labels(task=name, outcome="pending").inc()
        return False
    try:
        send()
    except BaseException:
        woken(name)
        raise
    WAKEUPS.labels(task=name, outcome="sent").inc()
    return True


def _mark(name: str) -> bool:
    """True when no wake-up of ``name`` was pending (and one is now)."""
    cache = caches[DEFAULT_CACHE_ALIAS]
    if not isinstance(cache, RedisCache):
        return True
    key = _key(name)
    try:
        return bool(_redis(cache, key).set(key, b"1", nx=True, ex=PENDING_SECONDS))
    except (RedisError, OSError):
        logger.warning("wake-up %s: cache unavailable, sending", name, exc_info=True)
        return True


def woken(name: str) -> None:
    """A run of ``name`` starts: the next commit that needs one sends a new wake-up."""
    cache = caches[DEFAULT_CACHE_ALIAS]
    if not isinstance(cache, RedisCache):
        return
    key = _key(name)
    try:
        _redis(cache, key).delete(key)
    except (RedisError, OSError):
        logger.warning("wake-up %s: cache unavailable", name, exc_info=True)
