"""Code sources and code packages in the admin panel, scoped to the orgs the user administers.

A code source is changed through ``packages.sources`` (URL checked against the allowed networks,
ref checked, audited); its deploy key is write-only: the page says whether one is stored and takes
a new one to replace it, never showing it. Packages are content the developers uploaded: listed,
not changed here."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.template.defaultfilters import filesizeformat

from workspaces.admin import OrgScopedAdmin, ReadOnlyAdmin

from . import sources
from .models import CodePackage, CodeSource


class CodeSourceForm(forms.ModelForm):
    deploy_key = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4, "autocomplete": "off"}),
        help_text="An SSH private key with read access. Stored encrypted, never shown: leave "
        "blank to keep the stored one, paste a new one to replace it.",
    )
    remove_deploy_key = forms.BooleanField(
        required=False, help_text="Remove the stored deploy key (a public repository needs none)."
    )

    class Meta:
        model = CodeSource
        fields = ["workspace", "name", "url", "default_ref", "known_hosts"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["deploy_key"].initial = None

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("deploy_key") and cleaned.get("remove_deploy_key"):
            self.add_error("remove_deploy_key", "either replace the deploy key or remove it")
        return cleaned


@admin.register(CodeSource)
class CodeSourceAdmin(OrgScopedAdmin):
    org_field = "workspace__organization_id"
    form = CodeSourceForm
    list_display = ["name", "workspace", "url", "default_ref", "deploy_key_stored", "updated_at"]
    list_select_related = ["workspace__organization"]
    search_fields = ["name", "url"]

    def get_fields(self, request, obj=None):
        editable = ["url", "default_ref", "known_hosts", "deploy_key"]
        if obj is None:
            return ["workspace", "name", *editable]
        return ["workspace", "name", *editable, "deploy_key_stored", "remove_deploy_key",
                "created_by", "created_at", "updated_at"]  # fmt: skip

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return ["workspace", "name", "deploy_key_stored", "created_by", "created_at", "updated_at"]

    @admin.display(description="deploy key", boolean=False)
    def deploy_key_stored(self, obj: CodeSource) -> str:
        return "set" if obj.has_deploy_key else "none"

    def save_model(self, request, obj, form, change):
        cleaned = form.cleaned_data
        if not change:

            def create(actor):
                created = sources.source_create(
                    actor=actor,
                    workspace=obj.workspace,
                    name=obj.name,
                    url=cleaned["url"],
                    default_ref=cleaned["default_ref"],
                    deploy_key=cleaned.get("deploy_key") or "",
                    known_hosts=cleaned.get("known_hosts") or "",
                )
                obj.pk = created.pk

            self.save_through(request, create)
            return
        data = {
            name: cleaned[name]
            for name in form.changed_data
            if name in ("url", "default_ref", "known_hosts")
        }
        if cleaned.get("deploy_key"):
            data["deploy_key"] = cleaned["deploy_key"]
        elif cleaned.get("remove_deploy_key"):
            data["deploy_key"] = ""
        self.save_through(
            request, lambda actor: sources.source_update(actor=actor, source=obj, data=data)
        )


@admin.register(CodePackage)
class CodePackageAdmin(ReadOnlyAdmin):
    org_field = "workspace__organization_id"
    list_display = ["sha256", "workspace", "size_shown", "uploaded_by", "created_at",
                    "last_used_at"]  # fmt: skip
    list_select_related = ["workspace__organization", "uploaded_by"]
    search_fields = ["sha256"]

    @admin.display(description="size", ordering="size")
    def size_shown(self, obj: CodePackage) -> str:
        return filesizeformat(obj.size)
