"""The Celery app. Broker from ``CELERY_BROKER_URL``: Redis in production and tests, kombu's
filesystem transport under ``var/`` (no server) by default; its folders are set in
``config/settings.py``, so every process that loads the settings has them."""

import functools
import os
import sys
import time
from pathlib import Path

from celery import Celery
from celery.signals import (
    before_task_publish,
    task_postrun,
    task_prerun,
    worker_process_shutdown,
    worker_ready,
)
from kombu.transport import redis as kombu_redis

from . import multiprocess

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def _worker_metrics_port() -> int:
    """The exporter's port when this process is a Celery worker that serves one, else 0."""
    command = Path(sys.argv[0]).name in ("celery", "__main__.py") and "worker" in sys.argv[1:]
    port = os.environ.get("MANTA_WORKER_METRICS_PORT", "").strip()
    return int(port) if command and port.isdigit() else 0


# A worker with an exporter counts in every pool child: the files go to one folder per worker,
# set before anything imports prometheus_client (config/multiprocess.py).
WORKER_METRICS_PORT = _worker_metrics_port()
if WORKER_METRICS_PORT:
    multiprocess.prepare(f"worker-{WORKER_METRICS_PORT}")

app = Celery("manta")
app.config_from_object("django.conf:settings", namespace="CELERY")


app.autodiscover_tasks()


# --- database connections -----------------------------------------------------------------


@task_prerun.connect
@task_postrun.connect
def _close_old_connections(task=None, **_kwargs) -> None:
    """What Django does at a request's start and end, at a task's: close a connection that is
    older than CONN_MAX_AGE or unusable, and have the next query check the one kept (its
    health check). Celery's own fix-up, which would close every connection here, waits for
    CELERY_DB_REUSE_MAX tasks (config/settings.py). An eager task runs inside its caller's
    request, transaction included: its connection is the caller's to manage."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


# --- metrics (config/worker_metrics.py imports prometheus_client: only when a task runs) ----


@before_task_publish.connect
def _stamp_published(headers=None, **_kwargs) -> None:
    if headers is not None:
        headers["manta_published_at"] = time.time()


@task_prerun.connect
def _task_started(task_id=None, task=None, **_kwargs) -> None:
    from .worker_metrics import task_started

    task_started(task_id, task)


@task_postrun.connect
def _task_finished(task_id=None, task=None, state=None, **_kwargs) -> None:
    from .worker_metrics import task_finished

    task_finished(task_id, task, state)


@worker_ready.connect
def _start_exporter(**_kwargs) -> None:
    if WORKER_METRICS_PORT:
        from django.conf import settings

        from .worker_metrics import exporter_start

        exporter_start(settings.MANTA_WORKER_METRICS_ADDRESS, WORKER_METRICS_PORT)


@worker_process_shutdown.connect
def _pool_child_exited(pid=None, **_kwargs) -> None:
    if WORKER_METRICS_PORT:
        from .worker_metrics import process_exited

        process_exited(pid or os.getpid())


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
