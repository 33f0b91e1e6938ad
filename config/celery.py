"""The Celery app. Broker from ``CELERY_BROKER_URL``: Redis in production and tests, kombu's
filesystem transport under ``var/`` (no server) by default."""

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("manta")
app.config_from_object("django.conf:settings", namespace="CELERY")


def _filesystem_broker_options(var_dir: Path) -> dict:
    queue = var_dir / "broker" / "queue"
    processed = var_dir / "broker" / "processed"
    control = var_dir / "broker" / "control"
    for folder in (queue, processed, control):
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(queue),
        "data_folder_out": str(queue),
        "processed_folder": str(processed),
        "control_folder": str(control),
        "store_processed": False,
    }


@app.on_configure.connect
def _configure_broker(sender: Celery, **_: object) -> None:
    from django.conf import settings

    if sender.conf.broker_url.startswith("filesystem://"):
        sender.conf.broker_transport_options = _filesystem_broker_options(settings.VAR_DIR)


app.autodiscover_tasks()


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
