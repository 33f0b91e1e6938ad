"""Templates and jobs in the admin panel, scoped to the orgs the user administers. Approve and
reject are admin actions that call the same services as the API (and are audited)."""

from django.contrib import admin, messages

from audit.context import Actor
from config.errors import DomainError
from workspaces.admin import ReadOnlyAdmin, ReadOnlyInline

from . import services
from .models import Job, JobEvent, JobTemplate, JobTemplateVersion


class VersionInline(ReadOnlyInline):
    model = JobTemplateVersion
    fields = ["version", "spec", "allowed_overrides", "created_by", "created_at"]


@admin.register(JobTemplate)
class JobTemplateAdmin(ReadOnlyAdmin):
    list_display = ["name", "workspace", "latest_version", "updated_at", "archived_at"]
    list_select_related = ["workspace"]
    search_fields = ["name"]
    inlines = [VersionInline]


class JobEventInline(ReadOnlyInline):
    model = JobEvent
    fields = ["created_at", "kind", "from_state", "to_state", "actor_label", "reason"]


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "name",
        "workspace",
        "state",
        "submitted_by",
        "requested_cpu",
        "requested_gpu",
        "created_at",
    ]
    list_filter = ["state", "approval_required"]
    list_select_related = ["workspace", "submitted_by"]
    search_fields = ["name", "submitted_by__email"]
    inlines = [JobEventInline]
    actions = ["approve", "reject"]

    def _decide(self, request, queryset, decide, verb):
        actor = Actor.for_user(request.user)
        done = 0
        for job in queryset:
            try:
                decide(actor, job)
                done += 1
            except DomainError as exc:
                self.message_user(request, f"job {job.pk}: {exc.detail}", level=messages.ERROR)
        if done:
            self.message_user(request, f"{verb} {done} job(s)")

    @admin.action(description="Approve selected jobs")
    def approve(self, request, queryset):
        self._decide(
            request,
            queryset,
            lambda actor, job: services.job_approve(actor=actor, job=job),
            "approved",
        )

    @admin.action(description="Reject selected jobs")
    def reject(self, request, queryset):
        reason = f"rejected in the admin panel by {request.user.email}"
        self._decide(
            request,
            queryset,
            lambda actor, job: services.job_reject(actor=actor, job=job, reason=reason),
            "rejected",
        )

    def has_change_permission(self, request, obj=None):
        # Changing rows is never allowed; the list needs "change" for actions to show.
        return obj is None and self._allowed(request)
