"""At submission: refuse a job that could never run, or that the workspace's queue or GPU
budget has no room for (the admission pass itself is ``jobs/admission.py``)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import status

from config.errors import Conflict, DomainError, InvalidInput
from quotas import selectors as quota_selectors
from quotas.ledger import budget_overrun, month_start
from quotas.models import RESOURCES

from .accounting import gpu_hours, gpu_hours_by_flavor
from .gpu_pools import check_flavors, flavor_budget_overrun
from .models import Job, JobState


class BudgetExhausted(Conflict):
    type = "budget_exhausted"


class QueueFull(DomainError):
    type = "queue_full"
    status_code = status.HTTP_429_TOO_MANY_REQUESTS


def check_submission(
    workspace,
    requested: dict[str, float],
    spec: dict[str, Any],
    host_capacity: dict[str, float | None] | None = None,
) -> None:
    """Refuse a job that can never run here (over its workspace's limit, a limit of a quota
    group above it, its organisation's capacity, or the capacity of the host it launches on),
    one the workspace's queue has no room for, or one over the GPU budget (in all, or of every
    flavor it could run on) when the workspace refuses those (otherwise it waits for next
    month)."""
    org_q = quota_selectors.org_quota(workspace.organization)  # unlimited when unset
    ws_q = quota_selectors.workspace_quota(workspace)
    above = quota_selectors.groups_above(ws_q)
    for name in RESOURCES:
        need = requested[name]
        ceilings = (
            (ws_q.limit()[name], "the workspace limit is"),
            *((g.limit()[name], f"quota group '{g.name}''s limit is") for g in above),
            (org_q.capacity()[name], "the organisation's capacity is"),
            ((host_capacity or {}).get(name), "the host its workspace launches on has"),
        )
        for ceiling, what in ceilings:
            if ceiling is not None and need > ceiling:
                raise InvalidInput.on(
                    f"requested.{name}",
                    f"this job needs {need:g} {name}; {what} {ceiling:g}, so it could never run",
                )
    if requested["gpu"]:
        book, claim = check_flavors(
            workspace, requested, spec, org_q, ws_q, on_host=host_capacity is not None, above=above
        )
        if ws_q.budget_action == "refuse" and any(
            (q or {}).get("gpu_hours_per_month") is not None for q in ws_q.gpu_flavors.values()
        ):
            used = gpu_hours_by_flavor(workspace, month_start(timezone.now()))
            book.hours_used = {workspace.pk: used}
            over = flavor_budget_overrun(book, claim)
            if over:
                field = "gpu_flavor" if claim.gpu_flavors else "requested.gpu"
                raise BudgetExhausted(over, errors={field: [over]})
    if ws_q.gpu_hours_per_month is not None and requested["gpu"]:
        used = gpu_hours(workspace, month_start(timezone.now()))
        over = budget_overrun(ws_q, used, requested["gpu"], spec["max_runtime_seconds"])
        if over and ws_q.budget_action == "refuse":
            raise BudgetExhausted(over, errors={"requested.gpu": [over]})
    if ws_q.max_queued_jobs is not None:
        # Counted only as far as the limit: a submission costs the same however long the queue.
        waiting = Job.objects.filter(
            workspace=workspace, state__in=[JobState.PENDING_APPROVAL, JobState.QUEUED]
        )[: ws_q.max_queued_jobs].count()
        if waiting >= ws_q.max_queued_jobs:
            raise QueueFull(
                f"the workspace already has {waiting} waiting jobs (max_queued_jobs "
                f"{ws_q.max_queued_jobs}); try again when some have started",
                errors={"max_queued_jobs": [str(ws_q.max_queued_jobs)]},
            )
