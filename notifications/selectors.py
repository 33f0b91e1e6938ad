"""Reads, scoped to the tenant the caller already resolved."""

from __future__ import annotations

from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from workspaces.models import Organization, Workspace

from .models import DeliveryState, WebhookAttempt, WebhookDelivery, WebhookEndpoint


def endpoints_of(organization: Organization, workspace: Workspace | None) -> QuerySet:
    """A workspace's endpoints, or the organisation-level ones when ``workspace`` is None."""
    qs = WebhookEndpoint.objects.filter(organization=organization).select_related(
        "organization", "workspace", "created_by"
    )
    qs = qs.filter(workspace=workspace) if workspace is not None else qs.filter(workspace=None)
    return qs.order_by("id")


def deliveries_of(endpoint: WebhookEndpoint) -> QuerySet:
    """Newest event first, each with its attempts (oldest first) and what its body needs."""
    return (
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .select_related(
            "endpoint__organization",
            "event__organization",
            "event__workspace",
            "audit_event__workspace",
        )
        .prefetch_related(
            Prefetch("attempts", queryset=WebhookAttempt.objects.order_by("started_at", "id"))
        )
        .order_by("-occurred_at", "-id")
    )


def endpoints_due() -> list[int]:
    """Enabled endpoints with a delivery due now whose lease (if any) has run out."""
    now = timezone.now()
    return list(
        WebhookDelivery.objects.filter(
            state=DeliveryState.PENDING, next_attempt_at__lte=now, endpoint__enabled=True
        )
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .values_list("endpoint_id", flat=True)
        .distinct()
        .order_by("endpoint_id")
    )
