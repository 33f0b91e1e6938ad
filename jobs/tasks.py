"""Celery entry points: thin, named, taking ids, safe to run twice."""

import json
import logging

from celery import shared_task
from celery.signals import worker_ready
from django.db import InterfaceError, OperationalError

from config import wakeup
from config.celery import send_many
from packages import services as package_services

from . import following, launching, pool_upkeep, preempting, selectors
from . import sweep as sweeping
from .dispatch import ADMIT

logger = logging.getLogger(__name__)

# Every task here is safe to run twice, so one that lost its database connection (PostgreSQL
# restarted, its backends terminated) runs again at once on a fresh connection instead of
# waiting for the sweep.
DB_RETRY = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "max_retries": 10,
}


@worker_ready.connect
def report_isolation(**_kwargs) -> None:
    """Say at start-up how the local target isolates tenant jobs here (or that it cannot)."""
    from .local_host import isolation_report

    report = isolation_report()
    if report["mode"] == "sandbox" and not report["ready"]:
        logger.error(
            "local target: isolation is on but this host cannot isolate (%s); local jobs will "
            "fail to launch until that is fixed or MANTA_LOCAL_ISOLATION=off is set",
            "; ".join(report["problems"]),
        )
    else:
        logger.info("local target isolation: %s", json.dumps(report))


@shared_task(name="manta.jobs.admit", **DB_RETRY)
def admit() -> dict[int, list[int]]:
    from .admission import admit_all

    wakeup.woken(ADMIT)  # before the pass reads: a commit from now on sends a new wake-up
    return admit_all()


PREEMPTING_INTERVAL = 1  # seconds between looks at a preempted driver in its grace period


@shared_task(name="manta.jobs.fan_out_launches", **DB_RETRY)
def fan_out_launches(attempt_ids: list[str]) -> None:
    send_many(launch_attempt, [(pk,) for pk in attempt_ids])


@shared_task(name="manta.jobs.launch_attempt", **DB_RETRY)
def launch_attempt(attempt_id: str) -> None:
    launching.attempt_launch(attempt_id)


@shared_task(name="manta.jobs.follow_attempt", **DB_RETRY)
def follow_attempt(attempt_id: str, token: int) -> None:
    next_in = following.attempt_follow(attempt_id, token)
    if next_in is not None:
        follow_attempt.apply_async((attempt_id, token), countdown=next_in)


@shared_task(name="manta.jobs.cancel_attempt", **DB_RETRY)
def cancel_attempt(attempt_id: str) -> None:
    following.attempt_cancel(attempt_id)


@shared_task(name="manta.jobs.evict_attempt", **DB_RETRY)
def evict_attempt(attempt_id: str) -> None:
    following.attempt_evict(attempt_id)


@shared_task(name="manta.jobs.preempt_attempt", **DB_RETRY)
def preempt_attempt(attempt_id: str) -> None:
    """A step of a preempted attempt's grace period, again every second until it is over."""
    if preempting.attempt_preempting_step(attempt_id):
        preempt_attempt.apply_async((attempt_id,), countdown=PREEMPTING_INTERVAL)


@shared_task(name="manta.jobs.sweep", **DB_RETRY)
def sweep() -> dict[str, int]:
    return sweeping.sweep()


@shared_task(name="manta.jobs.pool_fill", **DB_RETRY)
def pool_fill(pool_id: int) -> int:
    return pool_upkeep.pool_fill(pool_id)


@shared_task(name="manta.jobs.pool_stop", **DB_RETRY)
def pool_stop(cluster_ids: list[int]) -> int:
    return pool_upkeep.pool_stop(cluster_ids)


# The packages' retention sweep runs here: only jobs know which packages a live job still needs.
@shared_task(name="manta.packages.expire")
def expire_packages() -> int:
    return package_services.packages_expire(in_use=selectors.package_in_use)
