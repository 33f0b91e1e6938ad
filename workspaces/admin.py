"""The admin panel, for org owners and admins: each sees and edits only the organisations they
administer. Every write goes through the same services as the API, so it is validated and audited
the same way (the actor is the admin's user). The audit log is listed here too (audit sits below
workspaces, so its page is registered beside the org scoping it needs)."""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db.models import QuerySet
from django.http import HttpResponseRedirect

from audit.context import Actor
from audit.models import AuditEvent
from config.errors import DomainError

from . import services
from .models import Organization, OrgMembership, OrgRole, Workspace, WorkspaceMembership


def administered_org_ids(user) -> list[int]:
    cached = getattr(user, "_administered_org_ids", None)
    if cached is None:
        cached = list(
            OrgMembership.objects.filter(
                user=user, role__in=[OrgRole.OWNER, OrgRole.ADMIN]
            ).values_list("organization_id", flat=True)
        )
        user._administered_org_ids = cached
    return cached


class ServiceRefused(Exception):
    """A service refused an admin form's write; the message is already queued for the user."""


def refusal_text(exc: DomainError) -> str:
    """A service's refusal for a person: each field named with its rule."""
    lines = [f"{field}: {'; '.join(rules)}" for field, rules in exc.errors.items()]
    named = {rule for rules in exc.errors.values() for rule in rules}
    if exc.detail not in named and not any(exc.detail == line for line in lines):
        lines.insert(0, exc.detail)
    return " — ".join(lines) or exc.detail


def amounts_in_range(form: forms.Form, names, *, maximum: float = 1_000_000) -> None:
    """The API's bounds on amounts (0 to ``maximum``) on an admin form's number fields."""
    for name in names:
        field = form.fields.get(name)
        if field is not None:
            field.validators += [MinValueValidator(0), MaxValueValidator(maximum)]
            field.widget.attrs.update(min=0, max=maximum)


class OrgScopedAdmin(admin.ModelAdmin):
    """Rows are visible and editable only inside the orgs the user administers.
    ``org_field`` is the lookup from the model to its organisation id."""

    org_field = "organization_id"
    readonly_always: tuple[str, ...] = ()

    def _allowed(self, request, obj=None) -> bool:
        if not request.user.is_active or not request.user.is_staff:
            return False
        if request.user.is_superuser:
            return True
        orgs = administered_org_ids(request.user)
        if obj is None:
            return bool(orgs)
        return self.org_of(obj) in orgs

    def org_of(self, obj) -> int:
        value = obj
        for part in self.org_field.split("__"):
            value = getattr(value, part)
        return value

    def get_queryset(self, request) -> QuerySet:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(**{f"{self.org_field}__in": administered_org_ids(request.user)})

    def has_module_permission(self, request):
        return self._allowed(request)

    def has_view_permission(self, request, obj=None):
        return self._allowed(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._allowed(request, obj)

    def has_add_permission(self, request):
        return self._allowed(request)

    def has_delete_permission(self, request, obj=None):
        return False  # nothing is hard-deleted from the panel; archive instead

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if not request.user.is_superuser:
            orgs = administered_org_ids(request.user)
            if db_field.name == "organization":
                kwargs["queryset"] = Organization.objects.filter(pk__in=orgs)
            elif db_field.name == "workspace":
                kwargs["queryset"] = Workspace.objects.filter(
                    organization_id__in=orgs, archived_at=None
                )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def run_service(self, request, call: Callable[[Actor], object], *, label: str = "") -> bool:
        """Call a service as the admin's user; a refusal becomes an error message. For actions,
        which go on with the next row."""
        try:
            call(Actor.for_user(request.user))
        except DomainError as exc:
            prefix = f"{label}: " if label else ""
            self.message_user(request, prefix + refusal_text(exc), level=messages.ERROR)
            return False
        return True

    def save_through(self, request, call: Callable[[Actor], object]) -> None:
        """Call a service from ``save_model``; a refusal becomes an error message and undoes the
        whole request (the form is shown again, nothing saved, nothing logged as changed)."""
        if not self.run_service(request, call):
            raise ServiceRefused

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ServiceRefused:  # raised inside the view's transaction, which is rolled back
            return HttpResponseRedirect(request.get_full_path())


class ReadOnlyAdmin(OrgScopedAdmin):
    """Shown, never changed from the panel: the API's services own these rows' writes."""

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ReadOnlyInline(admin.TabularInline):
    """Child rows listed under an object the parent admin has already scoped to the user's
    orgs; ``fields`` are all read-only."""

    extra = 0
    can_delete = False

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    def has_add_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return True


@admin.register(Organization)
class OrganizationAdmin(OrgScopedAdmin):
    org_field = "pk"
    list_display = ["slug", "name", "created_at"]
    fields = ["slug", "name", "allowed_image_prefixes"]

    def get_readonly_fields(self, request, obj=None):
        return ["slug"] if obj else []

    def has_add_permission(self, request):
        return request.user.is_superuser

    def save_model(self, request, obj, form, change):
        if change:
            data = {name: form.cleaned_data[name] for name in form.changed_data}
            self.save_through(
                request,
                lambda actor: services.org_update(actor=actor, organization=obj, data=data),
            )
        else:

            def create(actor):
                org, _ = services.org_create(
                    actor=actor, slug=obj.slug, name=obj.name, owner_email=request.user.email
                )
                obj.pk = org.pk

            self.save_through(request, create)


class WorkspaceMembershipInline(ReadOnlyInline):
    model = WorkspaceMembership
    fields = ["user", "role", "created_at"]


@admin.register(Workspace)
class WorkspaceAdmin(OrgScopedAdmin):
    list_display = ["slug", "name", "organization", "approval_policy", "archived_at"]
    list_filter = ["approval_policy"]
    search_fields = ["slug", "name"]
    inlines = [WorkspaceMembershipInline]
    fields = [
        "organization",
        "slug",
        "name",
        "description",
        "approval_policy",
        "approval_thresholds",
        "compute_target",
        "archived_at",
    ]
    actions = ["archive"]

    def get_readonly_fields(self, request, obj=None):
        return ["organization", "slug", "archived_at"] if obj else ["archived_at"]

    def has_add_permission(self, request):
        return False  # workspaces are created through the API, which sets up their role groups

    def save_model(self, request, obj, form, change):
        data = {name: form.cleaned_data[name] for name in form.changed_data}
        self.save_through(
            request, lambda actor: services.workspace_update(actor=actor, workspace=obj, data=data)
        )

    @admin.action(description="Archive selected workspaces")
    def archive(self, request, queryset):
        for workspace in queryset:
            self.run_service(
                request,
                lambda actor, ws=workspace: services.workspace_archive(actor=actor, workspace=ws),
            )


@admin.register(OrgMembership)
class OrgMembershipAdmin(OrgScopedAdmin):
    list_display = ["user", "organization", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__email"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Read-only: the audit log is append-only everywhere, the panel included."""

    list_display = ["occurred_at", "action", "actor_label", "target_type", "target_repr",
                    "workspace", "request_id"]  # fmt: skip
    list_filter = ["action", "actor_type"]
    search_fields = ["action", "actor_label", "target_repr", "request_id"]
    date_hierarchy = "occurred_at"
    list_select_related = ["workspace", "organization"]


# The pages of people (accounts, invitations, tokens) and of compute targets, registered when
# imported; they build on the bases above.
from . import admin_people, admin_targets  # noqa: E402, F401
