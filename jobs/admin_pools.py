"""Warm pools in the admin panel: an org admin sees each pool's clusters (state, age, which
attempt took one) and its hits and misses, and resizes it (the same service as the API, which
validates and audits). Pools are created through the API, where the shape is validated."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from workspaces.admin import OrgScopedAdmin, ReadOnlyInline

from . import pools
from .api.pools import with_levels
from .models import WarmCluster, WarmPool


class WarmClusterInline(ReadOnlyInline):
    model = WarmCluster
    fields = ["state", "created_at", "ready_at", "claimed_at", "attempt", "stopped_at",
              "stop_reason"]  # fmt: skip

    def get_queryset(self, request):
        # The live clusters and the last few that ended: the pool's recent history.
        return super().get_queryset(request).order_by("-id")


@admin.register(WarmPool)
class WarmPoolAdmin(OrgScopedAdmin):
    list_display = ["id", "organization", "target_name", "size", "starting", "idle", "claimed",
                    "hits", "misses", "oldest_idle_age", "idle_timeout_seconds"]  # fmt: skip
    list_select_related = ["organization"]
    fields = ["organization", "target_name", "spec", "cpu", "memory_gb", "gpu", "disk_gb",
              "size", "idle_timeout_seconds", "hits", "misses"]  # fmt: skip
    readonly_fields = ["organization", "target_name", "spec", "cpu", "memory_gb", "gpu",
                       "disk_gb", "hits", "misses"]  # fmt: skip
    inlines = [WarmClusterInline]

    def get_queryset(self, request):
        return with_levels(super().get_queryset(request))

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="starting")
    def starting(self, obj):
        return obj.starting

    @admin.display(description="idle")
    def idle(self, obj):
        return obj.idle

    @admin.display(description="claimed")
    def claimed(self, obj):
        return obj.claimed

    @admin.display(description="oldest idle (s)")
    def oldest_idle_age(self, obj):
        if obj.oldest_idle is None:
            return "-"
        return f"{(timezone.now() - obj.oldest_idle).total_seconds():.0f}"

    def save_model(self, request, obj, form, change):
        data = {name: form.cleaned_data[name] for name in form.changed_data}

        def update(actor):
            pools.pool_update(actor=actor, pool=obj, data=data)

        self.save_through(request, update)
