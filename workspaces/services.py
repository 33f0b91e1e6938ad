"""Every write to identity and tenancy. Each function validates, changes rows, and records its audit
event in the same transaction."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from typing import Any

from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm

from audit import services as audit
from audit.context import Actor
from config import secrets as secrets_box
from config.errors import Conflict, Forbidden, InvalidInput, clean_or_raise
from outbox.services import event_emit

from . import roles, selectors
from .archive import require_active
from .models import (
    EMAIL_CATEGORIES,
    ApiToken,
    ComputeTarget,
    Organization,
    OrgMembership,
    OrgRole,
    User,
    Workspace,
    WorkspaceMembership,
    WorkspaceRole,
    WorkspaceRoleGroup,
)
from .roles import CODENAMES, WORKSPACE_ROLE_PERMISSIONS

TOKEN_PREFIX = "mnt_"
DEFAULT_IMAGE_PREFIXES = ["rayproject/"]


# --- users and organisations -------------------------------------------------------------------


def _check_password(password: str, user: User | None = None) -> None:
    try:
        validate_password(password, user)
    except DjangoValidationError as exc:
        message = "password: " + " ".join(exc.messages)
        raise InvalidInput(message, errors={"password": exc.messages}) from exc


def _sync_staff(user: User) -> None:
    """Staff (admin panel access) follows "administers at least one org"; superusers keep it."""
    administers = user.org_memberships.filter(role__in=[OrgRole.OWNER, OrgRole.ADMIN]).exists()
    is_staff = administers or user.is_superuser
    if user.is_staff != is_staff:
        user.is_staff = is_staff
        user.save(update_fields=["is_staff"])


@transaction.atomic
def org_create(
    *,
    actor: Actor,
    slug: str,
    name: str,
    owner_email: str,
    owner_password: str | None = None,
) -> tuple[Organization, User]:
    """Create an organisation and make ``owner_email`` its owner (creating the user if needed)."""
    if Organization.objects.filter(slug=slug).exists():
        raise Conflict(f"organisation {slug!r} already exists", errors={"slug": ["already taken"]})
    org = Organization(slug=slug, name=name or slug, allowed_image_prefixes=DEFAULT_IMAGE_PREFIXES)
    clean_or_raise(org)
    org.save()
    owner = User.objects.filter(email__iexact=owner_email).first()
    if owner is None:
        if owner_password:
            _check_password(owner_password, User(email=owner_email))
        owner = User.objects.create_user(owner_email, owner_password)
    OrgMembership.objects.create(organization=org, user=owner, role=OrgRole.OWNER)
    _sync_staff(owner)
    audit.record(
        actor=actor,
        action="org.create",
        target=org,
        organization=org,
        metadata={"owner": owner.email},
    )
    return org, owner


ORG_EDITABLE = ["name", "allowed_image_prefixes", "max_nodes_per_job"]


@transaction.atomic
def org_update(*, actor: Actor, organization: Organization, data: dict[str, Any]) -> Organization:
    org = Organization.objects.select_for_update().get(pk=organization.pk)
    audit.model_update(
        instance=org,
        fields=ORG_EDITABLE,
        data=data,
        actor=actor,
        action="org.update",
        organization=org,
    )
    return org


@transaction.atomic
def user_create_in_org(
    *,
    actor: Actor,
    organization: Organization,
    email: str,
    password: str,
    org_role: str = OrgRole.MEMBER,
    full_name: str = "",
) -> OrgMembership:
    """Create a new account as a member of ``organization`` (commands and fixtures; the API
    invites instead). An existing account is never adopted: it joins by invitation."""
    if org_role == OrgRole.OWNER and not _is_owner(actor, organization):
        raise InvalidInput.on("org_role", "only an owner can create another owner")
    if User.objects.filter(email__iexact=email).exists():
        raise Conflict(
            f"an account for {email} exists: invite it (orgs/{organization.slug}/invitations/)",
            errors={"email": ["an account exists: invite it"]},
        )
    _check_password(password, User(email=email, full_name=full_name))
    user = User.objects.create_user(email, password, full_name=full_name)
    membership = OrgMembership.objects.create(organization=organization, user=user, role=org_role)
    _sync_staff(user)
    audit.record(
        actor=actor,
        action="user.create",
        target=user,
        organization=organization,
        changes={"org_role": [None, org_role]},
    )
    return membership


def _is_org_admin(actor: Actor, organization: Organization) -> bool:
    return (
        actor.kind == "system"
        or OrgMembership.objects.filter(
            organization=organization,
            user_id=actor.user_id,
            role__in=roles.ORG_ROLES_ADMINISTERING_WORKSPACES,
        ).exists()
    )


def _is_owner(actor: Actor, organization: Organization) -> bool:
    return OrgMembership.objects.filter(
        organization=organization, user_id=actor.user_id, role=OrgRole.OWNER
    ).exists()


@transaction.atomic
def notification_preferences_update(
    *, actor: Actor, user: User, preferences: dict[str, bool]
) -> dict[str, bool]:
    """Turn email categories on or off for ``user``; returns every category's setting."""
    unknown = [key for key in preferences if key not in EMAIL_CATEGORIES]
    if unknown:
        raise InvalidInput.on(
            f"notification_preferences.{unknown[0]}",
            f"unknown category; choose from {', '.join(EMAIL_CATEGORIES)}",
        )
    user = User.objects.select_for_update().get(pk=user.pk)
    current = selectors.notification_preferences_of(user)
    merged = {**current, **{key: bool(value) for key, value in preferences.items()}}
    changes = {k: [current[k], merged[k]] for k in merged if current[k] != merged[k]}
    if changes:
        user.notification_preferences = merged
        user.save(update_fields=["notification_preferences"])
        audit.record(
            actor=actor,
            action="user.notification_preferences",
            target=user,
            changes={"notification_preferences": [current, merged]},
        )
    return merged


# --- API tokens --------------------------------------------------------------------------------


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def token_create(
    *, actor: Actor, user: User, name: str = "", expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """Issue a token; the secret is returned once and never stored."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = timezone.now() + dt.timedelta(days=expires_in_days) if expires_in_days else None
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=secret[: len(TOKEN_PREFIX) + 6],
        key_hash=token_hash(secret),
        expires_at=expires_at,
    )
    audit.record(
        actor=actor,
        action="token.create",
        target=token,
        target_repr=f"{token.prefix}… {name}".strip(),
        metadata={"expires_at": expires_at},
    )
    return token, secret


@transaction.atomic
def token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    token = ApiToken.objects.select_for_update().get(pk=token.pk)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit.record(
            actor=actor,
            action="token.revoke",
            target=token,
            target_repr=f"{token.prefix}… {token.name}".strip(),
        )
    return token


LAST_USED_RESOLUTION = dt.timedelta(seconds=60)


def token_authenticate(secret: str) -> ApiToken | None:
    """The usable token for ``secret``, or None. Marks it used (at most once a minute, so a busy
    client does not turn every read into a write)."""
    if not secret.startswith(TOKEN_PREFIX):
        return None
    token = ApiToken.objects.select_related("user").filter(key_hash=token_hash(secret)).first()
    now = timezone.now()
    if token is None or not token.is_usable(now) or not token.user.is_active:
        return None
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


# --- workspaces --------------------------------------------------------------------------------


def _role_groups_create(workspace: Workspace) -> None:
    for role, permissions in WORKSPACE_ROLE_PERMISSIONS.items():
        group = Group.objects.create(name=f"ws-{workspace.pk}-{role}")
        WorkspaceRoleGroup.objects.create(workspace=workspace, role=role, group=group)
        for permission in permissions:
            assign_perm(f"workspaces.{CODENAMES[permission]}", group, workspace)


@transaction.atomic
def workspace_create(
    *, actor: Actor, organization: Organization, slug: str, name: str = "", description: str = ""
) -> Workspace:
    if Workspace.objects.filter(organization=organization, slug=slug).exists():
        raise Conflict(
            f"workspace {slug!r} already exists in {organization.slug}",
            errors={"slug": ["already taken in this organisation"]},
        )
    workspace = Workspace(
        organization=organization, slug=slug, name=name or slug, description=description
    )
    clean_or_raise(workspace)
    try:
        with transaction.atomic():
            workspace.save()
    except IntegrityError as exc:  # a concurrent create won the slug
        raise Conflict(f"workspace {slug!r} already exists", errors={"slug": ["taken"]}) from exc
    _role_groups_create(workspace)
    audit.record(
        actor=actor,
        action="workspace.create",
        target=workspace,
        workspace=workspace,
        changes={"slug": [None, slug], "name": [None, workspace.name]},
    )
    event_emit(
        type="workspace.created",
        organization=organization,
        workspace=workspace,
        payload={"name": workspace.name, "description": description, "actor": actor.label},
    )
    return workspace


WORKSPACE_EDITABLE = [
    "name",
    "description",
    "approval_policy",
    "approval_thresholds",
    "compute_target",
    "adhoc_jobs",
]


APPROVAL_SETTINGS = frozenset({"approval_policy", "approval_thresholds"})


@transaction.atomic
def workspace_update(*, actor: Actor, workspace: Workspace, data: dict[str, Any]) -> Workspace:
    ws = Workspace.objects.select_for_update().select_related("organization").get(pk=workspace.pk)
    require_active(ws)

    def validate(changes: dict[str, list]) -> None:
        # Who approves is the organisation's call: a workspace admin could otherwise switch
        # approval off, submit their own job, and switch it back.
        approval = sorted(set(changes) & APPROVAL_SETTINGS)
        if approval and not _is_org_admin(actor, ws.organization):
            raise Forbidden(
                f"{approval[0]}: only organisation owners and admins change approval settings",
                errors={
                    name: ["only organisation owners and admins may change it"] for name in approval
                },
            )
        target_known = (
            ws.compute_target == "local"
            or ComputeTarget.objects.filter(
                organization_id=ws.organization_id, name=ws.compute_target
            ).exists()
        )
        if "compute_target" in changes and not target_known:
            raise InvalidInput.on("compute_target", "no compute target with this name")

    audit.model_update(
        instance=ws,
        fields=WORKSPACE_EDITABLE,
        data=data,
        actor=actor,
        action="workspace.update",
        validate=validate,
        workspace=ws,
    )
    return ws


@transaction.atomic
def workspace_archive(*, actor: Actor, workspace: Workspace) -> Workspace:
    ws = Workspace.objects.select_for_update().select_related("organization").get(pk=workspace.pk)
    if ws.archived_at is None:
        ws.archived_at = timezone.now()
        ws.save(update_fields=["archived_at"])
        audit.record(
            actor=actor,
            action="workspace.archive",
            target=ws,
            workspace=ws,
            changes={"archived_at": [None, ws.archived_at]},
        )
    return ws


# --- workspace members -------------------------------------------------------------------------


def _role_group(workspace: Workspace, role: str) -> Group:
    return (
        WorkspaceRoleGroup.objects.select_related("group").get(workspace=workspace, role=role).group
    )


def _set_group(membership: WorkspaceMembership, old_role: str | None) -> None:
    if old_role:
        membership.user.groups.remove(_role_group(membership.workspace, old_role))
    if membership.role:
        membership.user.groups.add(_role_group(membership.workspace, membership.role))


@transaction.atomic
def member_add(*, actor: Actor, workspace: Workspace, email: str, role: str) -> WorkspaceMembership:
    """Grant ``role`` on ``workspace`` to a member of the workspace's organisation."""
    require_active(workspace)
    if role not in WorkspaceRole.values:
        raise InvalidInput.on("role", f"must be one of {', '.join(WorkspaceRole.values)}")
    user = User.objects.filter(
        email__iexact=email, org_memberships__organization_id=workspace.organization_id
    ).first()
    if user is None:
        raise InvalidInput.on("email", "no member of this organisation has this email")
    if WorkspaceMembership.objects.filter(workspace=workspace, user=user).exists():
        raise Conflict(
            f"{user.email} already has a role in this workspace",
            errors={"email": ["already a member; change the role with PATCH"]},
        )
    membership = WorkspaceMembership.objects.create(workspace=workspace, user=user, role=role)
    _set_group(membership, None)
    audit.record(
        actor=actor,
        action="member.add",
        target=membership,
        workspace=workspace,
        changes={"role": [None, role]},
        metadata={"user": user.email},
    )
    event_emit(
        type="member.added",
        organization=workspace.organization,
        workspace=workspace,
        payload={"member": {"email": user.email, "role": role}, "actor": actor.label},
    )
    return membership


@transaction.atomic
def member_update(
    *, actor: Actor, membership: WorkspaceMembership, role: str
) -> WorkspaceMembership:
    require_active(membership.workspace)
    if role not in WorkspaceRole.values:
        raise InvalidInput.on("role", f"must be one of {', '.join(WorkspaceRole.values)}")
    membership = (
        WorkspaceMembership.objects.select_for_update()
        .select_related("user", "workspace__organization")
        .get(pk=membership.pk)
    )
    old = membership.role
    if old != role:
        membership.role = role
        membership.save(update_fields=["role"])
        _set_group(membership, old)
        audit.record(
            actor=actor,
            action="member.update",
            target=membership,
            workspace=membership.workspace,
            changes={"role": [old, role]},
            metadata={"user": membership.user.email},
        )
    return membership


@transaction.atomic
def member_remove(*, actor: Actor, membership: WorkspaceMembership) -> None:
    membership = (
        WorkspaceMembership.objects.select_for_update()
        .select_related("user", "workspace__organization")
        .get(pk=membership.pk)
    )
    require_active(membership.workspace)
    membership.user.groups.remove(_role_group(membership.workspace, membership.role))
    audit.record(
        actor=actor,
        action="member.remove",
        target=membership,
        workspace=membership.workspace,
        changes={"role": [membership.role, None]},
        metadata={"user": membership.user.email},
    )
    event_emit(
        type="member.removed",
        organization=membership.workspace.organization,
        workspace=membership.workspace,
        payload={
            "member": {"email": membership.user.email, "role": membership.role},
            "actor": actor.label,
        },
    )
    membership.delete()


# --- compute targets ---------------------------------------------------------------------------

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
