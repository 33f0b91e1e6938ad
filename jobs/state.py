"""The job state machine, in one place.

::

    pending_approval ──approve──▶ queued ──admit──▶ launching ──▶ running ──▶ succeeded
            │      ╲                 ▲  │              │             │  ╲──▶ failed
          reject    cancel           │  cancel      fail/cancel      │   ╲─▶ cancelled
            ▼                        │                               │
         rejected          retry / preempt ◀─────────────────────────┤
                                     ▲                          preempt (grace)
                                     │                               ▼
                                     └────── preempted ◀──────── preempting ──▶ cancelled

A running victim with a grace period first becomes ``preempting`` (its driver gets SIGTERM;
it keeps its reservation until its cluster is down), then ``queued`` (kind ``preempted``).

Every change goes through :func:`transition`, for one job or many: it locks the job rows (so two
writers serialise instead of racing a read-then-write), refuses an illegal move with 409
``invalid_transition``, and appends a JobEvent, records the audit event and emits the domain
events of each job, and releases the quota reservations of jobs leaving ``launching``/``running``
— in one transaction, with one write per table however many jobs move (an admission pass moves
hundreds at once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from audit import services as audit
from audit.context import Actor
from config.db import copy_insert
from config.errors import Conflict
from outbox.services import event_emit_many
from quotas import services as quota_services

from . import dispatch, metrics_events
from .models import ACTIVE_STATES, TERMINAL_STATES, Job, JobEvent, JobState

S = JobState
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING_APPROVAL: frozenset({S.QUEUED, S.REJECTED, S.CANCELLED}),
    S.QUEUED: frozenset({S.LAUNCHING, S.CANCELLED}),
    S.LAUNCHING: frozenset({S.RUNNING, S.FAILED, S.CANCELLED, S.QUEUED, S.SUCCEEDED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.QUEUED, S.PREEMPTING}),
    # A driver that finished before its SIGTERM keeps its success.
    S.PREEMPTING: frozenset({S.QUEUED, S.CANCELLED, S.SUCCEEDED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.REJECTED: frozenset(),
}

# The domain event each kind of move announces (kind defaults to the target state).
EVENT_TYPES = {
    "submitted": "job.submitted",
    "approved": "job.approved",
    "rejected": "job.rejected",
    "queued": "job.queued",
    "launching": "job.launching",
    "running": "job.running",
    "succeeded": "job.succeeded",
    "failed": "job.failed",
    "cancelled": "job.cancelled",
    "preempting": "job.preempting",
    "preempted": "job.preempted",
    "node_restarted": "job.node_restarted",
}


def event_types(kind: str, state: str) -> list[str]:
    """The domain events one move announces: its own, plus ``job.queued`` whenever the job lands
    in the queue and ``job.approval_requested`` when a submission waits for approval."""
    types = [EVENT_TYPES[kind]] if kind in EVENT_TYPES else []
    if state == S.QUEUED and "job.queued" not in types:
        types.append("job.queued")
    if kind == "submitted" and state == S.PENDING_APPROVAL:
        types.append("job.approval_requested")
    return types


class InvalidTransition(Conflict):
    type = "invalid_transition"


def is_legal(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS[from_state]


def job_payload(job: Job) -> dict[str, Any]:
    return {
        "job": {
            "id": job.pk,
            "name": job.name,
            "state": job.state,
            "workspace": job.workspace.slug,
            "organization": job.organization.slug,
            "submitted_by": job.submitted_by.email,
            "requested": job.requested,
            "priority": job.priority,
            "failure_reason": job.failure_reason,
            "message": job.message[:2000],
        }
    }


def record_event(
    job: Job,
    *,
    from_state: str,
    kind: str,
    actor: Actor,
    reason: str = "",
    data: dict[str, Any] | None = None,
    audit_action: str | None = None,
    changes: dict[str, Any] | None = None,
) -> None:
    """The rows every state change writes, for one job whose row the caller already changed:
    timeline entry, audit event, domain events."""
    _record(
        [job],
        from_states={job.pk: from_state},
        kind=kind,
        actor=actor,
        reason=reason,
        data_by_job={job.pk: data or {}},
        audit_action=audit_action,
        changes=changes,
    )


def _record(
    jobs: list[Job],
    *,
    from_states: Mapping[int, str],
    kind: str,
    actor: Actor,
    reason: str,
    data_by_job: Mapping[int, dict[str, Any]],
    audit_action: str | None,
    changes: dict[str, Any] | None = None,
) -> None:
    """A timeline event, an audit event and the domain events of each job, with one insert per
    table (COPY on PostgreSQL for many rows)."""
    copy_insert(
        JobEvent,
        (
            JobEvent(
                job=job,
                from_state=from_states[job.pk],
                to_state=job.state,
                kind=kind,
                actor=actor.user,
                actor_label=actor.label,
                reason=reason[:1000],
                data=data_by_job[job.pk],
            )
            for job in jobs
        ),
    )
    by_organization: dict[int, list[Job]] = {}
    for job in jobs:
        by_organization.setdefault(job.organization_id, []).append(job)
    for group in by_organization.values():  # one audit chain per organisation
        audit.record_many(
            actor=actor,
            organization=group[0].organization,
            entries=[
                {
                    "action": audit_action or "job.transition",
                    "target": job,
                    "target_repr": f"job {job.pk} {job.name}",
                    "workspace": job.workspace,
                    "changes": changes or {"state": [from_states[job.pk] or None, job.state]},
                    "metadata": {"kind": kind, "reason": reason, **data_by_job[job.pk]},
                }
                for job in group
            ],
        )
    event_emit_many(
        entries=[
            {
                "type": event_type,
                "organization": job.organization,
                "workspace": job.workspace,
                "payload": {**job_payload(job), "reason": reason, "actor": actor.label},
            }
            for job in jobs
            for event_type in event_types(kind, job.state)
        ]
    )


# What a move of many jobs reads of each: its state, what the timeline, audit and outbox rows say
# of it, and what launching it needs. The spec and the rest stay in the table.
BULK_FIELDS = (
    "id",
    "name",
    "state",
    "priority",
    "failure_reason",
    "message",
    "requested_cpu",
    "requested_memory_gb",
    "requested_gpu",
    "requested_disk_gb",
    "created_at",
    "queued_at",
    "started_at",
    "finished_at",
    "updated_at",
    "workspace__slug",
    "workspace__organization_id",
    "workspace__compute_target",
    "organization__slug",
    "submitted_by__email",
)


@overload
def transition(jobs: int, to_state: str, **options: Any) -> Job: ...
@overload
def transition(jobs: Sequence[Job], to_state: str, **options: Any) -> list[Job]: ...


@transaction.atomic
def transition(
    jobs: int | Sequence[Job],
    to_state: str,
    *,
    actor: Actor,
    kind: str | None = None,
    reason: str = "",
    data: dict[str, Any] | None = None,
    data_by_job: Mapping[int, dict[str, Any]] | None = None,
    audit_action: str | None = None,
    expect_from: frozenset[str] | None = None,
    mutate: Callable[[Job], None] | None = None,
    admit_here: Callable[[int], object] | None = None,
) -> Job | list[Job]:
    """Move one job (given by id; returns it, whole) or many (returns them, with
    :data:`BULK_FIELDS` loaded) to ``to_state``, or raise :class:`InvalidTransition` and move
    none.

    ``data`` goes on every job's timeline and audit event, ``data_by_job`` adds to it per job.
    ``expect_from`` narrows the legal sources further (an approval only moves a job that is
    waiting for one); ``mutate`` sets other fields on each locked row before it is saved.
    """
    one = isinstance(jobs, int)
    ids = [jobs] if one else [job.pk for job in jobs]
    if not ids:
        return []
    rows = Job.objects.select_for_update(of=("self",)).select_related(
        "workspace", "organization", "submitted_by"
    )
    if not one:
        rows = rows.only(*BULK_FIELDS)
    locked = list(rows.filter(pk__in=ids).order_by("pk"))
    if len(locked) != len(ids):
        missing = sorted(set(ids) - {job.pk for job in locked})
        raise Job.DoesNotExist(f"no job {missing[0]}")
    for job in locked:
        if not is_legal(job.state, to_state) or (expect_from and job.state not in expect_from):
            raise InvalidTransition(
                f"job {job.pk} is {job.state}; it cannot become {to_state}",
                errors={"state": [f"{job.state} → {to_state} is not allowed"]},
            )
    from_states = {job.pk: job.state for job in locked}
    entered = {job.pk: job.updated_at for job in locked}  # when each entered the state it leaves
    now = timezone.now()
    fields: dict[str, Any] = {"state": to_state, "updated_at": now}
    if to_state == S.QUEUED:
        fields["queued_at"] = Coalesce(F("queued_at"), Value(now))
    elif to_state == S.RUNNING:
        fields["started_at"] = Coalesce(F("started_at"), Value(now))
    elif to_state in TERMINAL_STATES:
        fields["finished_at"] = now
    for job in locked:
        job.state, job.updated_at = to_state, now
        if to_state == S.QUEUED:
            job.queued_at = job.queued_at or now
        elif to_state == S.RUNNING:
            job.started_at = job.started_at or now
        elif to_state in TERMINAL_STATES:
            job.finished_at = now
    if mutate:  # it may set any field: save each row whole
        for job in locked:
            mutate(job)
            job.save()
    else:
        Job.objects.filter(pk__in=ids).update(**fields)
    # What a job held while launching or running is free again in the same transaction.
    leaving = [pk for pk, state in from_states.items() if state in ACTIVE_STATES]
    if leaving and to_state not in ACTIVE_STATES:
        quota_services.reservations_release(leaving)
    merged = {job.pk: {**(data or {}), **(data_by_job or {}).get(job.pk, {})} for job in locked}
    # What the moves start (an admission pass, a launch) is registered before the outbox's wake-up
    # of the dispatcher, so it is the first thing run or sent once this commits.
    for job in locked:
        run_state_hooks(job, admit_here=admit_here)
    _record(
        locked,
        from_states=from_states,
        kind=kind or to_state,
        actor=actor,
        reason=reason,
        data_by_job=merged,
        audit_action=audit_action,
    )
    counted = dict(from_states=from_states, entered=entered, kind=kind or to_state, reason=reason)
    transaction.on_commit(  # a move rolled back is not counted
        lambda: metrics_events.jobs_moved(locked, data_by_job=merged, now=now, **counted),
        robust=True,
    )
    return locked[0] if one else locked


def run_state_hooks(job: Job, *, admit_here: Callable[[int], object] | None = None) -> None:
    """Schedule what the job's new state starts after commit (``jobs/dispatch.py``); an
    admission pass it asks for runs through ``admit_here`` when given, else as the admit
    task."""
    dispatch.after_transition(
        job.pk, job.state, organization_id=job.organization_id, admit_here=admit_here
    )
