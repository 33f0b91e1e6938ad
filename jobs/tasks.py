"""Celery entry points: thin, named, taking ids, safe to run twice."""

from celery import shared_task
from django.conf import settings

from . import execution


@shared_task(name="manta.jobs.admit")
def admit() -> dict[int, list[int]]:
    from quotas.scheduler import admit_all

    return admit_all()


@shared_task(name="manta.jobs.launch_attempt")
def launch_attempt(attempt_id: str) -> None:
    execution.attempt_launch(attempt_id)


@shared_task(name="manta.jobs.follow_attempt")
def follow_attempt(attempt_id: str, token: int) -> None:
    if execution.attempt_follow(attempt_id, token):
        follow_attempt.apply_async(
            (attempt_id, token), countdown=settings.MANTA_FOLLOW_INTERVAL_SECONDS
        )


@shared_task(name="manta.jobs.cancel_attempt")
def cancel_attempt(attempt_id: str) -> None:
    execution.attempt_cancel(attempt_id)


@shared_task(name="manta.jobs.sweep")
def sweep() -> dict[str, int]:
    return execution.sweep()
