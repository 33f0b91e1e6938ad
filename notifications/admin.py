"""Webhook endpoints and their deliveries in the admin panel, read-only and scoped to the orgs
the user administers: changes go through the API, whose services validate (SSRF guard, event
types) and audit them."""

from django.contrib import admin

from workspaces.admin import OrgScopedAdmin

from .models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


class ReadOnly(OrgScopedAdmin):
    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnly):
    list_display = ["id", "url", "workspace", "enabled", "disabled_reason", "failing_since"]
    list_filter = ["enabled"]
    search_fields = ["url", "description"]
    list_select_related = ["workspace"]
    exclude = ["audit_cursor"]


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    fields = ["started_at", "duration_ms", "status_code", "error", "response_excerpt"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return True  # the parent admin has already scoped the delivery to the user's orgs


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly):
    org_field = "endpoint__organization_id"
    list_display = ["id", "event_type", "endpoint", "state", "attempt_count", "occurred_at",
                    "next_attempt_at"]  # fmt: skip
    list_filter = ["state", "event_type"]
    search_fields = ["message_id"]
    list_select_related = ["endpoint"]
    inlines = [AttemptInline]
    exclude = ["data"]
