"""Who is preempted: giving guarantees back to workspaces under theirs, within the guarantees
jobs have of their own (a minimum runtime) and without preempting twice for the same need.

Admission (``jobs/admission.py``) calls :func:`plan_preemptions` inside its pass, under its
lock; the arithmetic is ``quotas/ledger.py``'s (:func:`~quotas.ledger.victims_for`). What
happens to a victim is ``jobs/attempts.py``'s ``attempts_preempt`` (a launching one leaves at
once) and ``jobs/preempting.py`` (a running one gets SIGTERM and a grace period first).

Two rules keep a preemption from being planned twice: a job still in its grace period
(``preempting``) is no candidate and its capacity counts as already leaving, and a queued job
whose victims are still leaving (:func:`promised_jobs`) is counted as admitted (the capacity is
promised to it) and plans nothing more.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.db import connection
from django.db.models import F, IntegerField, OuterRef, Subquery, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Least

from quotas import selectors as quota_selectors
from quotas.ledger import Held, Ledger, victims_for
from quotas.models import RESOURCES

from .models import ATTEMPT_ACTIVE, Job, JobAttempt, JobState


@dataclasses.dataclass
class Preemption:
    job: Job  # the queued job that gets its guarantee back
    victims: list[Held]

    def reason(self) -> str:
        return (
            f"preempted for job {self.job.pk} of workspace {self.job.workspace.slug}, "
            "which is under its guarantee"
        )


def preemption_candidates(organization_id: int) -> list[Held]:
    """The organisation's active reservations in preemption order — lowest priority first, then
    the newest admission (it has lost the least work) — each with its minimum runtime (capped
    by the organisation's max_min_runtime_seconds as it is now), when its attempt started
    running, and whether it is already leaving. One query."""
    running_since = Subquery(
        JobAttempt.objects.filter(job=OuterRef("job_id"), state__in=ATTEMPT_ACTIVE)
        .order_by("-number")
        .values("running_at")[:1]
    )
    asked = Cast(KeyTextTransform("min_runtime_seconds", "job__spec"), IntegerField())
    min_runtime = Least(
        Coalesce(asked, Value(0)),
        F("organization__max_min_runtime_seconds"),
        output_field=IntegerField(),
    )
    rows = (
        quota_selectors.active_reservations()
        .filter(organization_id=organization_id)
        .annotate(min_runtime=min_runtime, running_since=running_since)
        .order_by("job__priority", "-created_at", "-job_id")
        .values_list(
            "job_id",
            "workspace_id",
            "job__priority",
            "created_at",
            "min_runtime",
            "running_since",
            "job__state",
            "gpu_flavor",
            *RESOURCES,
        )
    )
    return [
        Held(
            job_id,
            ws_id,
            priority,
            at,
            dict(zip(RESOURCES, amounts, strict=True)),
            min_runtime_seconds=min_runtime or 0,
            running_since=since,
            leaving=state == JobState.PREEMPTING,
            gpu_flavor=flavor,
        )
        for job_id, ws_id, priority, at, min_runtime, since, state, flavor, *amounts in rows
    ]


def promised_jobs(organization_id: int, queued) -> list[Job]:
    """The jobs of ``queued`` (a queryset of the organisation's queued jobs) that preempted
    others still in their grace period: what those hold is promised to them.

    Every admission pass asks, and almost always there are none: the ids are found by one
    plain statement first, and ``queued`` is read only when there are some."""
    attempts, jobs = JobAttempt._meta.db_table, Job._meta.db_table
    active = sorted(ATTEMPT_ACTIVE)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT a.preempted_for_id FROM {attempts} a "
            f"JOIN {jobs} leaving ON leaving.id = a.job_id "
            f"JOIN {jobs} promised ON promised.id = a.preempted_for_id "
            f"WHERE leaving.state = %s AND a.state IN ({', '.join(['%s'] * len(active))}) "
            "AND promised.organization_id = %s AND promised.state = %s",
            [JobState.PREEMPTING, *active, organization_id, JobState.QUEUED],
        )
        ids = {row[0] for row in cursor.fetchall()}
    return list(queued.filter(pk__in=ids)) if ids else []


def plan_preemptions(
    ledger: Ledger,
    organization_id: int,
    queued,
    *,
    now: dt.datetime,
) -> list[Preemption]:
    """Give guarantees back: for each workspace whose next queued job (of ``queued``, the
    organisation's queue without the jobs already admitted or promised) fits within its
    guarantee but not in what is left, preempt running jobs of workspaces above their guarantee
    (borrowers) until it fits. One job per workspace per pass; the requeued victims trigger the
    next pass. Victims never come from a workspace within its guarantee, and a job that fits
    within its own guarantee can never be one, so two workspaces cannot preempt each other.

    What jobs in their grace period hold counts as already free here (they are leaving), so a
    job that fits once they are gone preempts nobody more and waits (it is held in ``ledger``,
    so a second workspace does not count the same capacity). A job within its minimum runtime
    (:meth:`~quotas.ledger.Held.protected`) is never a victim: others may be chosen instead.
    A job short of a GPU flavor it is guaranteed (at a group or the organisation) takes only
    jobs that hold that flavor and borrow it (``quotas.ledger.victims_for``).
    ``ledger`` is updated as if every victim had left and every planned job were admitted."""
    preemptions: list[Preemption] = []
    if not ledger.anyone_borrowing():
        return preemptions  # nobody holds more than their guarantee: there is nothing to take
    candidates: list[Held] | None = None
    for workspace_id in list(ledger.ws_quotas):
        if not ledger.under_guarantee(workspace_id):
            continue  # at or above its guarantee: it has nothing to take back
        job = queued.filter(workspace_id=workspace_id).select_related("workspace").first()
        if job is None or not ledger.within_guarantee(job) or ledger.workspace_blocker(job):
            continue
        if not ledger.reclaimable_blocker(job):
            if candidates is not None:
                ledger.hold(job)  # it fits in what is leaving: nobody else counts that
            continue  # it fits without anyone else leaving (or the policy held it back)
        if candidates is None:
            candidates = []
            for held in preemption_candidates(organization_id):
                if held.leaving:
                    ledger.hold(held, -1)  # on its way out already
                elif not held.protected(now):
                    candidates.append(held)
            if not ledger.reclaimable_blocker(job):
                ledger.hold(job)  # room once the leaving jobs are gone: it waits for them
                continue
        victims = victims_for(ledger, job, candidates)
        if victims is None:
            continue
        ledger.hold(job)
        preemptions.append(Preemption(job, victims))
        gone = {held.job_id for held in victims}
        candidates = [held for held in candidates if held.job_id not in gone]
    return preemptions
