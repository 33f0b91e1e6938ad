"""Coalesced wake-ups (config/wakeup.py): the admission pass and the outbox dispatcher are sent
once while a wake-up is pending, and the run it starts sees what committed meanwhile. The
broker and the cache are this machine's Redis; nothing consumes the messages sent here."""

from __future__ import annotations

import json
import time

import pytest
import redis
from django.conf import settings as django_settings
from django.db import transaction
from prometheus_client import REGISTRY

from audit.context import Actor
from config import wakeup
from jobs import dispatch
from jobs import services as job_services
from jobs import tasks as job_tasks
from jobs.models import Job
from notifications import tasks as notification_tasks
from outbox import services as outbox
from outbox.models import DomainEvent
from quotas.models import OrgQuota
from tests.conftest import build_world
from tests.jobs.conftest import counter_spec


def broker() -> redis.Redis:
    return redis.Redis.from_url(django_settings.CELERY_BROKER_URL)


def waiting(queue: str, task: str) -> int:
    """Messages of ``task`` on a queue of the broker (kombu's Redis transport keeps each queue
    as a list of JSON envelopes, the task's name in their headers)."""
    messages = (json.loads(raw) for raw in broker().lrange(queue, 0, -1))
    return sum(message["headers"]["task"] == task for message in messages)


def counted(task: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value("manta_wakeups_total", {"task": task, "outcome": outcome})
    return value or 0.0


def test_a_wakeup_is_sent_once_while_pending_and_again_once_its_run_starts():
    before = counted("test.wake", "sent"), counted("test.wake", "pending")
    sent: list[int] = []
    assert wakeup.wake("test.wake", lambda: sent.append(1)) is True
    assert wakeup.wake("test.wake", lambda: sent.append(2)) is False
    assert wakeup.wake("test.other", lambda: sent.append(3)) is True  # names are apart
    wakeup.woken("test.wake")
    assert wakeup.wake("test.wake", lambda: sent.append(4)) is True
    assert sent == [1, 3, 4]
    assert counted("test.wake", "sent") == before[0] + 2  # /metrics says how many were held back
    assert counted("test.wake", "pending") == before[1] + 1
    wakeup.woken("test.wake"), wakeup.woken("test.other")


def test_a_lost_wakeup_holds_the_next_one_back_only_until_it_expires(monkeypatch):
    monkeypatch.setattr(wakeup, "PENDING_SECONDS", 1)
    sent: list[int] = []
    wakeup.wake("test.lost", lambda: sent.append(1))  # its message never arrives
    assert wakeup.wake("test.lost", lambda: sent.append(2)) is False
    time.sleep(1.2)
    assert wakeup.wake("test.lost", lambda: sent.append(3)) is True
    assert sent == [1, 3]
    wakeup.woken("test.lost")


def test_a_send_that_fails_leaves_nothing_pending():
    def broker_away():
        raise ConnectionError("broker away")

    with pytest.raises(ConnectionError):
        wakeup.wake("test.fails", broker_away)
    sent: list[int] = []
    assert wakeup.wake("test.fails", lambda: sent.append(1)) is True
    assert sent == [1]
    wakeup.woken("test.fails")


def redis_cache_at(settings, port: int) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
        }
    }


@pytest.mark.parametrize("outage", ["refused", "hung"])
def test_with_redis_away_every_wakeup_is_sent_after_one_short_wait(settings, outage):
    """Refused: nothing listens. Hung: the port accepts connections and never answers (a
    stopped Redis). Either way the first wake-up waits at most ANSWER_SECONDS and sends; the
    next ones, for PENDING_SECONDS, send without asking."""
    with socket_closed(listening=outage == "hung") as port:
        redis_cache_at(settings, port)
        sent: list[int] = []
        started = time.monotonic()
        assert wakeup.wake("test.away", lambda: sent.append(0)) is True
        first = time.monotonic() - started
        for n in range(1, 4):
            assert wakeup.wake("test.away", lambda n=n: sent.append(n)) is True
        rest = time.monotonic() - started - first
    assert sent == [0, 1, 2, 3]
    assert first < 2 * wakeup.ANSWER_SECONDS + 0.5 and rest < 0.2, (first, rest)


def test_a_send_that_fails_with_redis_away_asks_nothing_more(settings, monkeypatch):
    monkeypatch.setattr(wakeup, "_away_until", time.monotonic() + 60)
    asked: list[str] = []
    monkeypatch.setattr(wakeup, "woken", asked.append)

    def broker_away():
        raise ConnectionError("broker away")

    with pytest.raises(ConnectionError):
        wakeup.wake("test.both", broker_away)
    assert asked == []  # no mark was set, none to clear


def test_a_cache_other_than_redis_sends_every_wakeup(settings, tmp_path):
    """A file cache need not be one the API's and the workers' hosts share: a worker could not
    clear the mark an API host left, so nothing is held back."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(tmp_path),
        }
    }
    sent: list[int] = []
    assert wakeup.wake("test.file", lambda: sent.append(1)) is True
    assert wakeup.wake("test.file", lambda: sent.append(2)) is True
    assert sent == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_jobs_queued_while_an_admit_task_is_pending_send_no_other_and_its_pass_admits_them(
    settings,
):
    """Three submissions past the one-hop bound: one admit message reaches the broker, and the
    task it carries, run as a worker runs it, admits all three; the next submission after the
    task started sends a new one."""
    settings.MANTA_INLINE_ADMISSION_MAX_QUEUED = 0  # every submission leaves it to the task
    world = build_world()
    OrgQuota.objects.create(organization=world.org, cpu=100)
    template = job_services.template_create(
        actor=Actor.for_user(world.users["owner"]), workspace=world.ws, name="one-cpu",
        spec=counter_spec(head={"cpu": 1, "memory_gb": 1}, worker_groups=[]),
    ).template  # fmt: skip
    developer = Actor.for_user(world.users["developer"])
    before = waiting(settings.JOBS_QUEUE, dispatch.ADMIT)

    queued = [
        job_services.job_submit(actor=developer, workspace=world.ws, template=template).pk
        for _ in range(3)
    ]

    assert waiting(settings.JOBS_QUEUE, dispatch.ADMIT) == before + 1
    assert job_tasks.admit() == {world.org.pk: queued}
    assert set(Job.objects.filter(pk__in=queued).values_list("state", flat=True)) == {"launching"}
    job_services.job_submit(actor=developer, workspace=world.ws, template=template)
    assert waiting(settings.JOBS_QUEUE, dispatch.ADMIT) == before + 2
    assert wakeup.wake(dispatch.ADMIT, lambda: None) is False  # the fourth's is pending


@pytest.mark.django_db(transaction=True)
def test_events_committed_while_the_dispatcher_is_pending_wake_it_once(settings):
    world = build_world()
    before = waiting(settings.WEBHOOKS_QUEUE, outbox.DISPATCH_TASK)
    for n in range(3):
        with transaction.atomic():
            outbox.event_emit(
                type="test.event", organization=world.org, workspace=world.ws, payload={"n": n}
            )
    assert waiting(settings.WEBHOOKS_QUEUE, outbox.DISPATCH_TASK) == before + 1
    assert DomainEvent.objects.filter(dispatched_at__isnull=True).count() >= 3

    notification_tasks.dispatch_events()  # as the webhooks worker runs it

    assert not DomainEvent.objects.filter(dispatched_at__isnull=True).exists()
    with transaction.atomic():
        outbox.event_emit(type="test.event", organization=world.org, payload={})
    assert waiting(settings.WEBHOOKS_QUEUE, outbox.DISPATCH_TASK) == before + 2


class socket_closed:
    """A loopback port nothing answers on, for as long as the block runs: bound only
    (connections are refused), or listening and never reading (connections hang)."""

    def __init__(self, *, listening: bool = False):
        self.listening = listening

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        if self.listening:
            self.sock.listen(16)
        return self.sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.sock.close()
