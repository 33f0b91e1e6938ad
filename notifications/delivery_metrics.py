"""What webhook delivery counts (families in ``config/metrics.py``): every attempt by endpoint
and outcome, and how long after its event it ended. Counted after the batch's outcomes commit,
in the worker that sent it."""

from __future__ import annotations

from django.utils import timezone

from config import metrics


def outcome_of(outcome) -> str:
    """``succeeded`` (2xx), ``gone`` (410: the endpoint is disabled), ``failed`` (any other
    status) or ``error`` (no answer: refused, timed out, blocked by the SSRF guard)."""
    if outcome.ok:
        return "succeeded"
    if outcome.status_code == 410:
        return "gone"
    return "failed" if outcome.status_code is not None else "error"


def attempts_sent(endpoint, sent) -> None:
    now = timezone.now()
    organization = endpoint.organization.slug
    workspace = endpoint.workspace.slug if endpoint.workspace_id else ""
    for item in sent:
        result = outcome_of(item.outcome)
        metrics.WEBHOOK_DELIVERIES.labels(
            organization=organization,
            workspace=workspace,
            endpoint=str(endpoint.pk),
            outcome=result,
        ).inc()
        latency = max(0.0, (now - item.delivery.occurred_at).total_seconds())
        metrics.WEBHOOK_LATENCY.labels(organization=organization, outcome=result).observe(latency)
