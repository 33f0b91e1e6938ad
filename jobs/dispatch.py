"""Where the job lifecycle hands work to the Celery workers: every task it sends goes through
here, by name.

The lifecycle modules (admission, attempts, following, state, sweep) never import
``jobs.tasks``: the tasks module imports them, and a task sent by name (``app.signature``, which
still honours eager mode in tests) closes no import circle. What a transition starts after its
commit is said here too (:func:`after_transition`), not wired from ``AppConfig.ready``.

Sending is best effort after a commit (``robust`` on-commit hooks): a broker that is away must not
turn a committed change into an error, and the sweep finds whatever was not sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from django.db import transaction

from config import wakeup
from config.celery import app

from .models import ATTEMPT_ACTIVE, TERMINAL_STATES, JobAttempt, JobState

ADMIT = "manta.jobs.admit"
LAUNCH = "manta.jobs.launch_attempt"
FAN_OUT = "manta.jobs.fan_out_launches"
FOLLOW = "manta.jobs.follow_attempt"
CANCEL = "manta.jobs.cancel_attempt"
EVICT = "manta.jobs.evict_attempt"
PREEMPT = "manta.jobs.preempt_attempt"
POOL_FILL = "manta.jobs.pool_fill"
POOL_STOP = "manta.jobs.pool_stop"

logger = logging.getLogger(__name__)

FAN_OUT_ABOVE = 8  # launches sent by one task instead of from the admission's commit


def send(name: str, *args, countdown: float | None = None) -> None:
    """Send task ``name`` now."""
    app.signature(name, args=args).apply_async(countdown=countdown)


def send_each(name: str, calls: Iterable[tuple]) -> None:
    """Send many messages of task ``name`` over one producer (one broker connection)."""
    signature = app.signature(name)
    with app.producer_or_acquire() as producer:
        for args in calls:
            signature.apply_async(args, producer=producer)


def on_commit(name: str, *args) -> None:
    """Send task ``name`` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: send(name, *args), robust=True)


def admit() -> None:
    """An admission pass for every organisation with queued jobs, unless one is already on its
    way (``config/wakeup.py``: that pass has not started reading, so it sees what committed)."""
    wakeup.wake(ADMIT, lambda: send(ADMIT))


def launch_attempts(attempt_ids: list[str]) -> None:
    """Send the launch tasks of an admission pass. A large pass sends one fan-out task instead,
    so the admission's commit does not wait for a thousand broker round trips."""
    if len(attempt_ids) > FAN_OUT_ABOVE:
        send(FAN_OUT, attempt_ids)
    else:
        send_each(LAUNCH, [(pk,) for pk in attempt_ids])


def pool_fill(pool_id: int) -> None:
    """Start what a warm pool lacks (in the background: each start takes Ray's start-up)."""
    send(POOL_FILL, pool_id)


def pool_stop(cluster_ids: list[int]) -> None:
    """Stop warm clusters that were retired (yielded, timed out, no longer wanted)."""
    send(POOL_STOP, cluster_ids)


def job_cancelled(job_id: int) -> None:
    """After a cancel commits: end the active attempt (stop the Ray job, tear the cluster down)."""
    attempts = JobAttempt.objects.filter(job_id=job_id, state__in=ATTEMPT_ACTIVE)
    send_each(CANCEL, [(str(pk),) for pk in attempts.values_list("pk", flat=True)])


def after_transition(
    job_id: int,
    state: str,
    *,
    organization_id: int | None = None,
    admit_here: Callable[[int], object] | None = None,
) -> None:
    """What a job's move into ``state`` starts once it commits: a job that joins the queue, or
    one that ends and frees what it held, starts an admission pass; a cancelled job's attempt is
    stopped.

    The pass is the admit task, unless the caller runs it here: ``admit_here`` (a request that
    queued a job passes ``admission.admit_inline``, so its launch task is the only hop) is
    called with the job's organisation after the commit, and should it fail, the task is sent
    after all."""
    if state == JobState.QUEUED or state in TERMINAL_STATES:
        if admit_here is not None and organization_id is not None:
            transaction.on_commit(lambda: _admit_here(admit_here, organization_id), robust=True)
        else:
            transaction.on_commit(admit, robust=True)
    if state == JobState.CANCELLED:
        transaction.on_commit(lambda: job_cancelled(job_id), robust=True)


def _admit_here(run: Callable[[int], object], organization_id: int) -> None:
    try:
        run(organization_id)
    except Exception:  # a committed change never fails for it: the admit task takes over
        logger.exception("admission in this process failed; sending the admit task")
        admit()
