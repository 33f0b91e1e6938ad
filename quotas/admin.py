"""Quotas in the admin panel: an organisation's capacity and queueing policy, and each
workspace's guaranteed share and limit per resource, scoped to the orgs the user administers.
Every change goes through ``quotas.services``, which checks guaranteed ≤ limit ≤ capacity and
Σ guaranteed ≤ capacity across the organisation, and audits it."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.http import HttpResponseRedirect

from workspaces.admin import (
    OrgScopedAdmin,
    ServiceRefused,
    administered_org_ids,
    amounts_in_range,
)

from . import selectors, services
from .models import RESOURCES, OrgQuota, QuotaGroup, WorkspaceQuota

UNITS = {"cpu": "CPUs", "memory_gb": "GB memory", "gpu": "GPUs", "disk_gb": "GB disk"}
BUDGET_FIELDS = ["max_running_jobs", "max_queued_jobs", "gpu_hours_per_month", "budget_action"]
# The form names the tree's relations as fields (``group``, ``parent``); the services take them
# as groups and store their ids.
WS_FORM_FIELDS = [name.removesuffix("_id") for name in services.WS_FIELDS]
GROUP_FORM_FIELDS = [name.removesuffix("_id") for name in services.GROUP_FIELDS]
LENDING_HELP = {
    f"lending_limit_{n}": f"{UNITS[n]} of its guarantee it lends while idle; empty = all of it"
    for n in RESOURCES
}


def _amount(value: float | None) -> str:
    return "unlimited" if value is None else f"{value:g}"


class OrgQuotaForm(forms.ModelForm):
    class Meta:
        model = OrgQuota
        fields = ["organization", *services.ORG_FIELDS]
        help_texts = {name: f"Capacity in {UNITS[name]}; empty = unlimited" for name in RESOURCES}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        amounts_in_range(self, RESOURCES)


@admin.register(OrgQuota)
class OrgQuotaAdmin(OrgScopedAdmin):
    form = OrgQuotaForm
    list_display = ["organization", *RESOURCES, "max_running_jobs", "policy", "preemption",
                    "updated_at"]  # fmt: skip
    list_select_related = ["organization"]

    def get_readonly_fields(self, request, obj=None):
        return ["organization", "in_use"] if obj else []

    def get_fields(self, request, obj=None):
        fields = ["organization", *services.ORG_FIELDS]
        return [*fields, "in_use"] if obj else fields

    @admin.display(description="held now by launching and running jobs")
    def in_use(self, obj: OrgQuota) -> str:
        held = selectors.active_reservations().filter(organization_id=obj.organization_id)
        totals = held.aggregate(**selectors.TOTALS)
        return (
            ", ".join(
                f"{name} {totals[name] or 0:g} of {_amount(getattr(obj, name))}"
                for name in RESOURCES
            )
            + f"; {totals['jobs']} job(s)"
        )

    def save_model(self, request, obj, form, change):
        data = {
            name: form.cleaned_data[name] for name in form.changed_data if name != "organization"
        }
        organization = obj.organization

        def update(actor):
            quota = services.org_quota_update(actor=actor, organization=organization, data=data)
            obj.pk = quota.pk

        self.save_through(request, update)


class WorkspaceQuotaForm(forms.ModelForm):
    class Meta:
        model = WorkspaceQuota
        fields = ["workspace", *WS_FORM_FIELDS]
        help_texts = {
            **LENDING_HELP,
            "group": "Its quota group; empty = directly under the organisation",
            **{f"guaranteed_{n}": f"{UNITS[n]} always available to it" for n in RESOURCES},
            **{f"limit_{n}": f"{UNITS[n]} at most; empty = up to the capacity" for n in RESOURCES},
            "gpu_hours_per_month": "Budget; empty = none (alerts at 80 % and 100 %)",
            "fair_share_weight": "Under fair_share, its share (now and past) is divided by "
            "this: 2 lets it use twice what a workspace of weight 1 uses. More than 0; empty = 1",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        amounts_in_range(
            self,
            [f"{kind}_{name}" for kind in ("guaranteed", "limit") for name in RESOURCES]
            + ["gpu_hours_per_month"],
        )
        weight = self.fields.get("fair_share_weight")
        if weight is not None:
            weight.required = False  # empty: the default, 1
            weight.widget.attrs.update(min=0, max=1_000_000, step="any")

    def clean_fair_share_weight(self) -> float:
        weight = self.cleaned_data.get("fair_share_weight")
        if weight is None:
            return 1.0
        if not 0 < weight <= 1_000_000:
            raise forms.ValidationError("must be greater than 0 and at most 1000000")
        return weight


def _column(name: str):
    """A list column: a workspace's guaranteed amount of ``name`` and its limit."""

    @admin.display(description=f"{name} guaranteed / limit")
    def column(self, obj: WorkspaceQuota) -> str:
        return f"{getattr(obj, f'guaranteed_{name}'):g} / {_amount(getattr(obj, f'limit_{name}'))}"

    return column


@admin.register(WorkspaceQuota)
class WorkspaceQuotaAdmin(OrgScopedAdmin):
    org_field = "workspace__organization_id"
    form = WorkspaceQuotaForm
    list_display = ["workspace", "organization", *RESOURCES, "max_running_jobs",
                    "gpu_hours_per_month", "updated_at"]  # fmt: skip
    list_select_related = ["workspace__organization"]
    search_fields = ["workspace__slug"]
    cpu, memory_gb, gpu, disk_gb = (_column(name) for name in RESOURCES)

    def get_readonly_fields(self, request, obj=None):
        return ["workspace", "in_use"] if obj else []

    def get_fieldsets(self, request, obj=None):
        return [
            (None, {"fields": ["workspace", "in_use"] if obj else ["workspace"]}),
            ("Guaranteed", {"fields": [f"guaranteed_{name}" for name in RESOURCES]}),
            ("Limit", {"fields": [f"limit_{name}" for name in RESOURCES]}),
            ("Jobs and GPU budget", {"fields": BUDGET_FIELDS}),
            ("Fair share", {"fields": ["fair_share_weight"]}),
            ("GPU flavors", {"fields": ["gpu_flavors"]}),
            ("Quota tree", {"fields": ["group", *(f"lending_limit_{n}" for n in RESOURCES)]}),
        ]

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "group" and not request.user.is_superuser:
            kwargs["queryset"] = QuotaGroup.objects.filter(
                organization_id__in=administered_org_ids(request.user)
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    @admin.display(description="organisation")
    def organization(self, obj: WorkspaceQuota):
        return obj.workspace.organization

    @admin.display(description="held now by launching and running jobs")
    def in_use(self, obj: WorkspaceQuota) -> str:
        held = selectors.reserved(obj.workspace)
        return ", ".join(
            f"{name} {held[name]:g} of {_amount(getattr(obj, f'limit_{name}'))}"
            for name in RESOURCES
        )

    def save_model(self, request, obj, form, change):
        data = {name: form.cleaned_data[name] for name in form.changed_data if name != "workspace"}
        workspace = obj.workspace

        def update(actor):
            quota = services.workspace_quota_update(actor=actor, workspace=workspace, data=data)
            obj.pk = quota.pk

        self.save_through(request, update)


class QuotaGroupForm(forms.ModelForm):
    class Meta:
        model = QuotaGroup
        fields = ["organization", *GROUP_FORM_FIELDS]
        help_texts = {
            **{f"guaranteed_{n}": f"{UNITS[n]} always available to its subtree" for n in RESOURCES},
            **{
                f"limit_{n}": f"{UNITS[n]} at most; empty = up to the limit above"
                for n in RESOURCES
            },
            **LENDING_HELP,
            "parent": "The group it is under; empty = directly under the organisation",
            "fair_share_weight": "Under fair_share, its subtree's share among its siblings is "
            "divided by this. More than 0",
            "gpu_flavors": 'Per GPU flavor, e.g. {"h100": {"guaranteed": 4, "limit": 8, '
            '"lending_limit": 2}}; within its GPU totals. No lending_limit = it lends all',
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        amounts_in_range(
            self,
            [f"{kind}_{n}" for kind in ("guaranteed", "limit", "lending_limit") for n in RESOURCES],
        )


@admin.register(QuotaGroup)
class QuotaGroupAdmin(OrgScopedAdmin):
    """The quota tree's groups: created, edited and (when empty) deleted through
    ``quotas.services``, which keep the tree a tree and its numbers consistent."""

    form = QuotaGroupForm
    list_display = ["name", "organization", "parent", *RESOURCES, "max_running_jobs",
                    "fair_share_weight", "updated_at"]  # fmt: skip
    list_select_related = ["organization", "parent"]
    list_filter = ["organization"]
    search_fields = ["name"]
    cpu, memory_gb, gpu, disk_gb = (_column(name) for name in RESOURCES)

    def get_readonly_fields(self, request, obj=None):
        return ["organization", "in_use"] if obj else []

    def get_fieldsets(self, request, obj=None):
        return [
            (None, {"fields": ["organization", "name", "parent", *(["in_use"] if obj else [])]}),
            ("Guaranteed", {"fields": [f"guaranteed_{n}" for n in RESOURCES]}),
            ("Limit", {"fields": [f"limit_{n}" for n in RESOURCES]}),
            ("Lending limit", {"fields": [f"lending_limit_{n}" for n in RESOURCES]}),
            ("Jobs and fair share", {"fields": ["max_running_jobs", "fair_share_weight"]}),
            ("GPU flavors", {"fields": ["gpu_flavors"]}),
        ]

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "parent" and not request.user.is_superuser:
            kwargs["queryset"] = QuotaGroup.objects.filter(
                organization_id__in=administered_org_ids(request.user)
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_delete_permission(self, request, obj=None):
        return self._allowed(request, obj)  # an empty group; the service refuses the others

    @admin.display(description="held now by its subtree's launching and running jobs")
    def in_use(self, obj: QuotaGroup) -> str:
        tree = selectors.quota_tree(obj.organization)
        found = _find(tree, obj.name)
        if found is None:
            return "-"
        flavors = "".join(
            f", {name} {shown['usage']:g} of {_amount(shown['limit'])}"
            for name, shown in found["gpu_flavors"].items()
            if name in (obj.gpu_flavors or {}) or shown["usage"]
        )
        return (
            ", ".join(
                f"{name} {found['usage'][name]:g} of {_amount(obj.limit()[name])}"
                for name in RESOURCES
            )
            + flavors
            + f"; {found['running']} job(s)"
        )

    def save_model(self, request, obj, form, change):
        fields = [name for name in form.changed_data if name != "organization"]
        data = {name: form.cleaned_data[name] for name in fields}
        organization = obj.organization

        def save(actor):
            if change:
                group = QuotaGroup.objects.get(pk=obj.pk)
                services.quota_group_update(actor=actor, group=group, data=data)
            else:
                group = services.quota_group_create(
                    actor=actor, organization=organization, data=data
                )
                obj.pk = group.pk

        self.save_through(request, save)

    def delete_model(self, request, obj):
        self.save_through(
            request, lambda actor: services.quota_group_delete(actor=actor, group=obj)
        )

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except ServiceRefused:  # a group with something under it: back to its page, unchanged
            return HttpResponseRedirect(request.path.removesuffix("delete/") + "change/")


def _find(node: dict, name: str) -> dict | None:
    if node["level"] == "group" and node["name"] == name:
        return node
    for child in node["children"]:
        found = _find(child, name)
        if found is not None:
            return found
    return None
