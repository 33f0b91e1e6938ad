"""The Celery app. Broker from ``CELERY_BROKER_URL``: Redis in production and tests, kombu's
filesystem transport under ``var/`` (no server) by default; its folders are set in
``config/settings.py``, so every process that loads the settings has them."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("manta")
app.config_from_object("django.conf:settings", namespace="CELERY")


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
