"""Webhook endpoints and their deliveries in the admin panel, read-only and scoped to the orgs
the user administers: changes go through the API, whose services validate (SSRF guard, event
types) and audit them."""

from django.contrib import admin

from workspaces.admin import ReadOnlyAdmin, ReadOnlyInline

from .models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "url", "workspace", "enabled", "disabled_reason", "failing_since"]
    list_filter = ["enabled"]
    search_fields = ["url", "description"]
    list_select_related = ["workspace"]
    exclude = ["audit_cursor"]


class AttemptInline(ReadOnlyInline):
    model = WebhookAttempt
    fields = ["started_at", "duration_ms", "status_code", "error", "response_excerpt"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    org_field = "endpoint__organization_id"
    list_display = ["id", "event_type", "endpoint", "state", "attempt_count", "occurred_at",
                    "next_attempt_at"]  # fmt: skip
    list_filter = ["state", "event_type"]
    search_fields = ["message_id"]
    list_select_related = ["endpoint"]
    inlines = [AttemptInline]
    exclude = ["data"]
