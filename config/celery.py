"""The Celery app. Broker from ``CELERY_BROKER_URL``: Redis in production and tests, kombu's
filesystem transport under ``var/`` (no server) by default; its folders are set in
``config/settings.py``, so every process that loads the settings has them."""

import functools
import os

from celery import Celery
from kombu.transport import redis as kombu_redis

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("manta")
app.config_from_object("django.conf:settings", namespace="CELERY")


app.autodiscover_tasks()


def _redis_channels_remember_their_broker() -> None:
    """Let a Redis channel reach its broker after its connection was collected.

    Why (celery 5.7 / kombu 5.7; reproduced, and proven by ``tests/e2e/test_faults.py``): when
    the worker loses Redis while it holds unacknowledged messages (ETA tasks such as our
    ``follow_attempt`` countdowns, or running ``acks_late`` tasks) and a BRPOP is in flight, it
    first calls ``Connection.collect()``. There the task channel's close fails on the dead BRPOP
    socket, another channel's close fails on the dead broker and stops the loop, and collect
    still detaches the transport from its ``Connection`` (``transport.client = None``). Celery
    then calls ``connection.close()``, which closes the task channel again: this time it drops
    the channel's Redis pool and goes on to restore its unacknowledged messages, which needs a
    new pool, whose address ``_connparams`` reads from ``transport.client`` —
    ``AttributeError: 'NoneType' object has no attribute 'hostname'``. That is not a connection
    error, so it escapes the consumer's reconnect loop and the worker exits ("Unrecoverable
    error"). celery/kombu#582 is the same missing address on another close path.

    The shim: each channel keeps the ``Connection`` its pools were built from and lends it to
    ``_connparams`` while the transport has none. The restore then talks to Redis like any other
    broker call: it works if Redis is back, or fails with a connection error that Celery already
    ignores at that point and retries from. Remove it once kombu stops reading a detached
    transport's client.
    """
    connparams = kombu_redis.Channel._connparams

    @functools.wraps(connparams)
    def _connparams(self, asynchronous=False):
        transport = self.connection
        if transport.client is not None:
            self._manta_broker = transport.client
            return connparams(self, asynchronous)
        transport.client = getattr(self, "_manta_broker", None)
        try:
            return connparams(self, asynchronous)
        finally:
            transport.client = None  # as collect() left it

    kombu_redis.Channel._connparams = _connparams


_redis_channels_remember_their_broker()


def send_many(task, calls: list[tuple]) -> None:
    """Send many messages of one task over one producer (one broker connection)."""
    with app.producer_or_acquire() as producer:
        for args in calls:
            task.apply_async(args, producer=producer)


@app.task(name="manta.probe", ignore_result=True)
def probe(key: str) -> None:
    """Record when a worker ran this (Unix time, in the broker's Redis under ``key``): how long
    a task waits between ``.delay()`` and a worker starting it. Used by bench/dispatch.py."""
    import time

    import redis

    redis.Redis.from_url(app.conf.broker_url).set(key, repr(time.time()), ex=600)
