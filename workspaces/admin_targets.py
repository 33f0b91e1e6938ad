"""Compute targets in the admin panel. A target's secrets (a Ray cluster's token, a kubeconfig)
are write-only here as in the API: the page says which are stored and takes a new value to
replace one, and never renders a stored value back, not even into a form field."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from rest_framework.exceptions import ValidationError as SerializerError

from config.errors import field_errors

from . import compute_targets as targets
from .admin import OrgScopedAdmin
from .api.serializers import validate_target_config
from .models import ComputeTarget, Workspace

SECRET_HELP = {
    "token": "The Ray cluster's auth token (kind ray). Stored encrypted, never shown: leave "
    "blank to keep the stored one, type a new one to replace it.",
    "kubeconfig": "kubeconfig YAML (kind kuberay). Stored encrypted, never shown: leave blank "
    "to keep the stored one, paste a new one to replace it.",
}


class ComputeTargetForm(forms.ModelForm):
    # Write-only: a PasswordInput that never renders its value, and a textarea with no initial.
    token = forms.CharField(
        required=False,
        max_length=4096,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text=SECRET_HELP["token"],
    )
    kubeconfig = forms.CharField(
        required=False,
        max_length=200_000,
        widget=forms.Textarea(attrs={"rows": 4, "autocomplete": "off"}),
        help_text=SECRET_HELP["kubeconfig"],
    )

    class Meta:
        model = ComputeTarget
        fields = ["organization", "name", "kind", "config"]
        help_texts = {
            "config": 'The settings without secrets, as JSON, e.g. {"address": '
            '"http://ray-head:8265"} for kind ray.',
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["token"].initial = None
        self.fields["kubeconfig"].initial = None
        # What the service is given: the settings, and only the secrets typed in this form.
        self.target_config: dict[str, Any] = {}

    def clean(self):
        cleaned = super().clean()
        kind = cleaned.get("kind") or self.instance.kind
        if not kind or "config" in self.errors:
            return cleaned
        config = cleaned.get("config")
        config = {} if config is None else config
        if not isinstance(config, dict):
            self.add_error("config", "must be a JSON object")
            return cleaned
        typed = {key: cleaned[key] for key in targets.SECRET_CONFIG_KEYS if cleaned.get(key)}
        stored = targets.compute_target_secrets(self.instance) if self.instance.pk else {}
        try:
            # A stored secret counts for the rules (a kuberay target needs its kubeconfig).
            valid = validate_target_config(kind, {**stored, **config, **typed})
        except SerializerError as exc:
            for name, rules in field_errors(exc.detail).items():
                name = name.removeprefix("config.")
                field = name if name in self.fields and name != "kind" else None
                self.add_error(field, rules if field else [f"{name}: {r}" for r in rules])
            return cleaned
        kept = set(stored) - set(typed)
        self.target_config = {key: value for key, value in valid.items() if key not in kept}
        return cleaned


@admin.register(ComputeTarget)
class ComputeTargetAdmin(OrgScopedAdmin):
    form = ComputeTargetForm
    list_display = ["name", "kind", "organization", "stored_secrets", "updated_at"]
    list_filter = ["kind"]
    search_fields = ["name"]
    list_select_related = ["organization"]

    def get_fields(self, request, obj=None):
        secrets = ["token", "kubeconfig"]
        if obj is None:
            return ["organization", "name", "kind", "config", *secrets]
        return ["organization", "name", "kind", "config", "stored_secrets", *secrets, "in_use_by"]

    def get_readonly_fields(self, request, obj=None):
        return ["organization", "name", "kind", "stored_secrets", "in_use_by"] if obj else []

    @admin.display(description="secrets")
    def stored_secrets(self, obj: ComputeTarget) -> str:
        if not obj.secret_encrypted:
            return "none stored"
        return ", ".join(f"{name}: set" for name in sorted(targets.compute_target_secrets(obj)))

    @admin.display(description="used by workspaces")
    def in_use_by(self, obj: ComputeTarget) -> str:
        slugs = Workspace.objects.filter(
            organization_id=obj.organization_id, compute_target=obj.name, archived_at=None
        ).values_list("slug", flat=True)
        return ", ".join(slugs) or "—"

    def save_model(self, request, obj, form, change):
        config = form.target_config
        if change:
            self.save_through(
                request,
                lambda actor: targets.compute_target_update(actor=actor, target=obj, config=config),
            )
            return

        def create(actor):
            created = targets.compute_target_create(
                actor=actor,
                organization=obj.organization,
                name=obj.name,
                kind=obj.kind,
                config=config,
            )
            obj.pk = created.pk

        self.save_through(request, create)
