"""Why a queued job that fits waits: what the next admission pass would do with it.

``jobs.admission.explain`` asks the ledger first: a job kept out by a limit, a capacity, a
budget or a GPU flavor is told which. A job that fits on its own can still wait for the rest
of the queue: a job ahead of it that keeps strict order (``fifo``; ``balanced`` and
``intelligent`` once a job has waited its turn), its workspace's earlier job (``fair_share``
takes each workspace's jobs in order), capacity held back for an overdue job, or a reservation
in time for one (``jobs/backfill.py``). ``explain`` runs the pass the workers would run, on a
copy of the ledger and without writing anything, with a :class:`Watch` on the job: the pass
tells it what it passed over and where it stopped, and the watch keeps what concerns that job.

A pass without a watch gets :data:`NOBODY`, which keeps nothing. The texts are built only for
the watched job (each call takes a function that makes it and its arguments), so a pass pays
nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# What says why a job waits: a function that makes the text, and its arguments.
Why = tuple[Callable[..., str], *tuple[Any, ...]]


NEXT_PASS = "waiting for the next admission pass"
# What a watch says kept its job out, as a category beside the ledger's (a dry run's blocker):
# the jobs the pass admits first take the room it needs ("admission_pass"), an earlier job
# keeps order before it ("queue_order"), or what it needs is held back for an overdue job
# ("held_back").
QUEUE_REASONS = ("queue_order", "held_back")
# A stopping watch gives up after the pass admitted this many jobs before its own: a queue of
# jobs that all fit (workers down) must not make a job's detail replay all of them.
MOST_ADMITTED = 1000


class Decided(Exception):
    """A stopping watch's job is decided: the rest of the pass is not needed."""


class Watch:
    """One job's fate in one pass: ``reason`` is what kept it out (None: nothing did). With
    ``stop``, the watch ends the pass (:class:`Decided`) as soon as the job is admitted or
    passed over, or once the pass has admitted :data:`MOST_ADMITTED` jobs before it: for a pass
    run only to explain (``jobs.admission.explain``), not for a replay that goes on."""

    def __init__(self, job_pk: int | None, workspace_id: int | None, *, stop: bool = False):
        self.job_pk, self.workspace_id, self.stop = job_pk, workspace_id, stop
        self.reason: str | None = None
        self.kind: str | None = None  # its category: "admission_pass" or QUEUE_REASONS
        self.ahead = 0  # jobs the pass admitted before it

    def _keep(self, why: Why, kind: str, prefix: str = "") -> None:
        if self.reason is None and self.job_pk is not None:
            explain, *args = why
            self.reason, self.kind = prefix + explain(*args), kind
            if self.stop:
                raise Decided

    def admitted(self, job: Any) -> None:
        """The pass admitted ``job``."""
        if self.job_pk is None or not self.stop:
            return
        if job.pk == self.job_pk:
            raise Decided
        self.ahead += 1
        if self.ahead >= MOST_ADMITTED:
            self.reason = f"{NEXT_PASS}, which admits more than {MOST_ADMITTED} jobs before it"
            self.kind = "admission_pass"
            raise Decided

    def passed(self, job: Any, kind: str, *why: Any) -> None:
        """The pass did not admit ``job``, for ``why`` (of category ``kind``)."""
        if job.pk == self.job_pk:
            self._keep(why, kind)

    def workspace_waits(self, head: Any, *why: Any) -> None:
        """``head`` does not start (for ``why``), and its workspace's later jobs wait behind it
        for the rest of the pass (``fair_share``)."""
        if head.workspace_id == self.workspace_id and head.pk != self.job_pk:
            prefix = f"behind job {head.pk}, first in its workspace's queue: "
            self._keep(why, "queue_order", prefix)

    def stopped(self, at: Any, *why: Any) -> None:
        """The pass looked at no job after ``at``, for ``why``. Kept only for a watched job
        the pass had not reached (the caller knows whether it admitted it)."""
        if at.pk != self.job_pk:
            self._keep(why, "queue_order")


NOBODY = Watch(None, None)


def in_this_pass(blocker: str, admitted: list) -> str:
    """What keeps a job out in a pass that admitted ``admitted`` before it."""
    if not admitted:
        return blocker
    n = len(admitted)
    return f"{blocker} (counting the {n} job{'s' if n > 1 else ''} the next pass admits first)"


def held_for(what: str, holder: Any) -> str:
    """What keeps a job out when ``what`` is held back for the overdue job ``holder``."""
    return (
        f"{what} held back for job {holder.pk}, which has waited more than "
        "balanced_max_wait_seconds for capacity within its workspace's guarantee"
    )
