"""Compute targets: where an organisation's jobs run. The secrets in a target's config (an auth
token, a kubeconfig) are stored encrypted, apart from the rest; every write is audited."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit import services as audit
from audit.context import Actor
from config import secrets as secrets_box
from config.errors import Conflict

from .models import ComputeTarget, Organization, Workspace

SECRET_CONFIG_KEYS = ("token", "kubeconfig")


def _split_secrets(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    plain = {k: v for k, v in config.items() if k not in SECRET_CONFIG_KEYS}
    hidden = {k: config[k] for k in SECRET_CONFIG_KEYS if config.get(k)}
    return plain, hidden


@transaction.atomic
def compute_target_create(
    *, actor: Actor, organization: Organization, name: str, kind: str, config: dict[str, Any]
) -> ComputeTarget:
    if ComputeTarget.objects.filter(organization=organization, name=name).exists():
        raise Conflict(f"compute target {name!r} exists", errors={"name": ["already taken"]})
    plain, hidden = _split_secrets(config)
    target = ComputeTarget.objects.create(
        organization=organization,
        name=name,
        kind=kind,
        config=plain,
        secret_encrypted=secrets_box.encrypt_json(hidden) if hidden else "",
    )
    audit.record(
        actor=actor,
        action="compute_target.create",
        target=target,
        organization=organization,
        changes={"kind": [None, kind], "config": [None, plain]},
        metadata={"secrets": sorted(hidden)},
    )
    return target


@transaction.atomic
def compute_target_update(
    *, actor: Actor, target: ComputeTarget, config: dict[str, Any]
) -> ComputeTarget:
    target = ComputeTarget.objects.select_for_update().get(pk=target.pk)
    plain, hidden = _split_secrets(config)
    before = target.config
    target.config = plain
    if hidden:
        target.secret_encrypted = secrets_box.encrypt_json(hidden)
    target.save(update_fields=["config", "secret_encrypted", "updated_at"])
    audit.record(
        actor=actor,
        action="compute_target.update",
        target=target,
        organization=target.organization,
        changes={"config": [before, plain]},
        metadata={"secrets_replaced": sorted(hidden)},
    )
    return target


@transaction.atomic
def compute_target_delete(*, actor: Actor, target: ComputeTarget) -> None:
    in_use = Workspace.objects.filter(
        organization_id=target.organization_id, compute_target=target.name, archived_at=None
    ).values_list("slug", flat=True)
    if in_use:
        raise Conflict(
            f"compute target {target.name!r} is used by workspace(s) {', '.join(in_use)}",
            errors={"name": ["in use"]},
        )
    audit.record(
        actor=actor,
        action="compute_target.delete",
        target=target,
        organization=target.organization,
        changes={"kind": [target.kind, None]},
    )
    target.delete()


def compute_target_secrets(target: ComputeTarget) -> dict[str, Any]:
    return secrets_box.decrypt_json(target.secret_encrypted) or {}
