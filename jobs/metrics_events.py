"""What the job lifecycle counts as it happens (the families are in ``config/metrics.py``):
one call from the state machine for every move, and one per launch phase. In the process that
made the move: the API for submissions, approvals and cancels, the Celery worker for the rest.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from config import metrics

from .models import JobState

S = JobState
AWAITING_APPROVAL = S.PENDING_APPROVAL
DECISIONS = {S.QUEUED: "approved", S.REJECTED: "rejected", S.CANCELLED: "cancelled"}


def jobs_moved(
    jobs: Sequence,
    *,
    from_states: Mapping[int, str],
    entered: Mapping[int, dt.datetime],
    kind: str,
    reason: str,
    data_by_job: Mapping[int, Mapping[str, Any]],
    now: dt.datetime,
) -> None:
    """Count a transition of ``jobs`` (already in their new state). ``entered`` is when each
    entered the state it left (its ``updated_at`` before the move)."""
    for job in jobs:
        source, target = from_states[job.pk], job.state
        labels = metrics.tenant(job)
        metrics.JOB_TRANSITIONS.labels(
            **labels, from_state=source, to_state=target, kind=kind
        ).inc()
        waited = max(0.0, (now - entered[job.pk]).total_seconds()) if entered.get(job.pk) else 0
        if source == S.QUEUED and target == S.LAUNCHING:
            # Submit → admitted for a first admission; requeue → admitted for later ones.
            first = data_by_job.get(job.pk, {}).get("attempt") == 1 and job.created_at
            if first:
                waited = max(0.0, (now - job.created_at).total_seconds())
            metrics.ADMISSION_WAIT.labels(**labels).observe(waited)
        elif source == AWAITING_APPROVAL and target in DECISIONS:
            metrics.APPROVAL_WAIT.labels(**labels, decision=DECISIONS[target]).observe(waited)
        if source == S.RUNNING and target != S.RUNNING:
            # A run preempted with a grace period ends (its work is lost) when the grace starts.
            outcome = "preempted" if kind == "preempting" else kind
            outcome = outcome if outcome in ("retry", "preempted") else target
            metrics.RUN_TIME.labels(**labels, outcome=outcome).observe(waited)
        # A preemption counts when it is decided: the eviction follows the grace, if any.
        cause = data_by_job.get(job.pk, {}).get("cause", "guarantee_reclaimed")
        if kind == "preempting" or (kind == "preempted" and source != S.PREEMPTING):
            metrics.PREEMPTIONS.labels(**labels, reason=cause).inc()
        if kind == "preempted":
            metrics.EVICTIONS.labels(**labels, reason="preempted").inc()
        elif kind == "retry":
            metrics.RETRIES.labels(**labels, reason=reason or "unknown").inc()
            metrics.EVICTIONS.labels(**labels, reason=reason or "unknown").inc()
        elif target == S.FAILED:
            metrics.FAILURES.labels(**labels, reason=reason or "unknown").inc()
        if reason == "cluster_lost" and kind in ("retry", S.FAILED):
            metrics.CLUSTER_LOST.labels(**labels).inc()


def gpu_lost(jobs: Sequence, seconds_by_job: Mapping[int, float]) -> None:
    """Count the GPU-hours preempted attempts of ``jobs`` had run (once per attempt: the caller
    counts only the move that ended it)."""
    for job in jobs:
        seconds = seconds_by_job.get(job.pk, 0.0)
        if seconds > 0:
            metrics.PREEMPTED_GPU_HOURS.labels(**metrics.tenant(job)).inc(seconds / 3600)


@contextlib.contextmanager
def launch_phase(job, phase: str) -> Iterator[None]:
    """Time one phase of a launch (``cluster_start``, ``submit``) when it completes."""
    started = time.monotonic()
    yield
    metrics.LAUNCH_PHASE.labels(**metrics.tenant(job), phase=phase).observe(metrics.since(started))


def warm_claim(pool, *, hit: bool) -> None:
    """An attempt of a warm pool's shape took a warm cluster (a hit) or started cold (a miss)."""
    metrics.WARM_CLAIMS.labels(
        organization=pool.organization.slug,
        target=pool.target_name,
        pool=str(pool.pk),
        result="hit" if hit else "miss",
    ).inc()
