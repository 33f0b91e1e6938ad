"""Webhook endpoints and the deliveries of domain events to them.

The dispatcher (``notifications/dispatch.py``) fans each outbox event (``outbox.DomainEvent``) out
into one :class:`WebhookDelivery` per matching endpoint; a delivery row is the truth about one
message to one endpoint (state, next attempt, lease), and every HTTP attempt it makes is kept as
a :class:`WebhookAttempt`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class WebhookEndpoint(models.Model):
    """Where an organisation (``workspace`` empty) or one workspace wants its events POSTed.

    ``event_types`` is a list of registered types, or ``["*"]`` for every type but
    ``audit.event`` (which an org endpoint must name: it is a firehose). ``audit_cursor`` is the
    last audit-chain ``seq`` of the organisation fanned out to this endpoint.
    """

    ALL = "*"

    organization = models.ForeignKey(
        "workspaces.Organization", on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    workspace = models.ForeignKey(
        "workspaces.Workspace",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="webhook_endpoints",
    )
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=500, blank=True)
    event_types = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=300, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    # Set at the first failure after a success; cleared by any success. Drives auto-disable.
    failing_since = models.DateTimeField(null=True, blank=True)
    audit_cursor = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["organization", "enabled"], name="webhook_org_enabled_idx"),
        ]

    def __str__(self) -> str:
        return f"webhook {self.pk} {self.url}"

    def subscribes(self, event_type: str) -> bool:
        if event_type in self.event_types:
            return True
        return self.ALL in self.event_types and event_type != "audit.event"


class WebhookSecret(models.Model):
    """A signing secret (``whsec_…``), Fernet-encrypted at rest. Rotation adds a new one and
    gives the previous ones an ``expires_at``: until then both sign every message."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="secrets")
    secret_encrypted = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"secret {self.pk} of webhook {self.endpoint_id}"


class DeliveryState(models.TextChoices):
    PENDING = "pending"  # waiting for its first or next attempt (next_attempt_at)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # given up without retrying: the endpoint answered 410 Gone
    EXHAUSTED = "exhausted"  # every attempt of the retry schedule failed


class WebhookDelivery(models.Model):
    """One message to one endpoint. ``message_id`` is the ``webhook-id`` header: the same on
    every attempt and redelivery, so receivers can deduplicate on it.

    The message is a domain event, an audit event (``audit.event`` streaming) or, for
    ``webhook.ping``, the ``data`` stored here.
    """

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.ForeignKey(
        "outbox.DomainEvent", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    audit_event = models.ForeignKey(
        "audit.AuditEvent", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    event_type = models.CharField(max_length=64)
    occurred_at = models.DateTimeField()
    data = models.JSONField(default=dict, blank=True)
    message_id = models.CharField(max_length=80)
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempt_count = models.PositiveIntegerField(default=0)
    # Failed attempts since the delivery was created or last redelivered: the position in the
    # retry schedule.
    round_failures = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # A worker that claims the row holds it until then; a worker that dies leaves it to expire.
    lease_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        ordering = ["-occurred_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "event"],
                condition=models.Q(event__isnull=False),
                name="uniq_delivery_endpoint_event",
            ),
            models.UniqueConstraint(
                fields=["endpoint", "audit_event"],
                condition=models.Q(audit_event__isnull=False),
                name="uniq_delivery_endpoint_audit",
            ),
        ]
        indexes = [
            # what is due, per endpoint, oldest event first (the drain and the sweep)
            models.Index(
                fields=["endpoint", "next_attempt_at", "occurred_at"],
                condition=models.Q(state="pending"),
                name="delivery_due_idx",
            ),
            models.Index(fields=["endpoint", "-occurred_at", "-id"], name="delivery_list_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.message_id} → webhook {self.endpoint_id}"


class WebhookAttempt(models.Model):
    """One HTTP request of a delivery (or the reason none could be made)."""

    EXCERPT_BYTES = 1024

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempts")
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    response_excerpt = models.TextField(blank=True)  # at most EXCERPT_BYTES of the body
    error = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["started_at", "id"]

    def __str__(self) -> str:
        return f"attempt {self.pk} of delivery {self.delivery_id}: {self.status_code or self.error}"
