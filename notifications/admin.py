"""Webhook endpoints and their deliveries in the admin panel, scoped to the orgs the user
administers. An endpoint's URL, description, event types and enabled flag are changed through
``notifications.services.webhook_update`` (SSRF guard, known event types, audited; re-enabling
sends what waited); a ping and a redelivery are actions through the same services as the API.
Signing secrets are never shown: the API shows one once, when it is made."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from workspaces.admin import OrgScopedAdmin, ReadOnlyAdmin, ReadOnlyInline

from . import services
from .models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

RECENT_DELIVERIES = 20


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")

    class Meta:
        model = WebhookEndpoint
        fields = services.ENDPOINT_EDITABLE
        help_texts = {
            "event_types": 'A JSON list of event types, e.g. ["job.failed", "job.succeeded"], '
            'or ["*"] for all.',
        }

    def clean_event_types(self):
        value = self.cleaned_data["event_types"]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise forms.ValidationError("must be a JSON list of event type names")
        return value


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(OrgScopedAdmin):
    form = WebhookEndpointForm
    list_display = ["id", "url", "workspace", "enabled", "disabled_reason", "failing_since"]
    list_filter = ["enabled"]
    search_fields = ["url", "description"]
    list_select_related = ["workspace__organization"]
    readonly_fields = [
        "organization",
        "workspace",
        "disabled_reason",
        "disabled_at",
        "failing_since",
        "created_by",
        "created_at",
        "recent_deliveries",
    ]
    fields = [*services.ENDPOINT_EDITABLE, *readonly_fields]
    actions = ["ping"]

    def has_add_permission(self, request):
        return False  # created through the API, which shows the new signing secret once

    @admin.display(description=f"last {RECENT_DELIVERIES} deliveries")
    def recent_deliveries(self, obj: WebhookEndpoint) -> str:
        rows = obj.deliveries.order_by("-occurred_at", "-id")[:RECENT_DELIVERIES]
        body = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse("admin:notifications_webhookdelivery_change", args=[row.pk]),
                    row.pk,
                    row.event_type,
                    row.state,
                    row.attempt_count,
                    row.last_status_code or row.last_error or "—",
                )
                for row in rows
            ),
        )
        if not body:
            return "none yet"
        return format_html(
            "<table><tr><th>delivery</th><th>event</th><th>state</th><th>attempts</th>"
            "<th>last answer</th></tr>{}</table>",
            body,
        )

    def save_model(self, request, obj, form, change):
        data = {name: form.cleaned_data[name] for name in form.changed_data}
        self.save_through(
            request, lambda actor: services.webhook_update(actor=actor, endpoint=obj, data=data)
        )

    @admin.action(description="Send a ping to the selected endpoints")
    def ping(self, request, queryset):
        done = sum(
            self.run_service(
                request,
                lambda actor, e=endpoint: services.webhook_ping(actor=actor, endpoint=e),
                label=f"endpoint {endpoint.pk}",
            )
            for endpoint in queryset.select_related("organization", "workspace")
        )
        if done:
            self.message_user(request, f"Queued a ping to {done} endpoint(s).")


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
    actions = ["redeliver"]

    @admin.action(description="Redeliver selected deliveries now")
    def redeliver(self, request, queryset):
        done = sum(
            self.run_service(
                request,
                lambda actor, d=delivery: services.delivery_redeliver(actor=actor, delivery=d),
                label=f"delivery {delivery.pk}",
            )
            for delivery in queryset
        )
        if done:
            self.message_user(request, f"Queued {done} delivery(ies) to be sent again.")
