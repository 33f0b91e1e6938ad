"""The outbox: one row per domain event, written in the same transaction as the change it
describes, so nothing is announced that did not commit and nothing that committed is lost.

A row is only data: writing one does nothing else. :func:`outbox.services.event_emit` writes them
and wakes the dispatcher (``notifications/dispatch.py``), which fans each event out to webhook
endpoints and emails and sets ``dispatched_at``.
"""

from __future__ import annotations

import uuid

from django.db import models


class DomainEvent(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    type = models.CharField(max_length=64)  # job.submitted, job.approved, member.added, …
    organization = models.ForeignKey(
        "workspaces.Organization", on_delete=models.PROTECT, related_name="+"
    )
    workspace = models.ForeignKey(
        "workspaces.Workspace", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    occurred_at = models.DateTimeField(auto_now_add=True, db_index=True)
    payload = models.JSONField(default=dict)
    dispatched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "notifications_domainevent"  # moved from notifications; the table stays
        ordering = ["occurred_at", "id"]
        indexes = [
            models.Index(
                fields=["occurred_at"],
                condition=models.Q(dispatched_at__isnull=True),
                name="event_undispatched_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"
