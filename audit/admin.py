from django.contrib import admin

from workspaces.admin import ReadOnlyAdmin

from .models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Read-only: the audit log is append-only everywhere, the panel included."""

    list_display = ["occurred_at", "action", "actor_label", "target_type", "target_repr",
                    "workspace", "request_id"]  # fmt: skip
    list_filter = ["action", "actor_type"]
    search_fields = ["action", "actor_label", "target_repr", "request_id"]
    date_hierarchy = "occurred_at"
    list_select_related = ["workspace", "organization"]
