"""Every write to tenancy: organisations, workspaces and their members. Each function validates,
changes rows, and records its audit event in the same transaction. (Accounts' credentials and
settings are in ``identity``, compute targets in ``compute_targets``, invitations in
``invitations``.)"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm

from audit import services as audit
from audit.context import Actor
from config.errors import Conflict, Forbidden, InvalidInput, clean_or_raise
from outbox.services import event_emit

from . import roles
from .archive import require_active
from .identity import require_valid_password, sync_staff
from .models import (
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

DEFAULT_IMAGE_PREFIXES = ["rayproject/"]


# --- organisations -----------------------------------------------------------------------------


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
            require_valid_password(owner_password, User(email=owner_email))
        owner = User.objects.create_user(owner_email, owner_password)
    OrgMembership.objects.create(organization=org, user=owner, role=OrgRole.OWNER)
    sync_staff(owner)
    audit.record(
        actor=actor,
        action="org.create",
        target=org,
        organization=org,
        metadata={"owner": owner.email},
    )
    return org, owner


ORG_EDITABLE = [
    "name",
    "allowed_image_prefixes",
    "max_nodes_per_job",
    "max_min_runtime_seconds",
    "preemption_grace_seconds",
]


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
    require_valid_password(password, User(email=email, full_name=full_name))
    user = User.objects.create_user(email, password, full_name=full_name)
    membership = OrgMembership.objects.create(organization=organization, user=user, role=org_role)
    sync_staff(user)
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


# --- workspaces --------------------------------------------------------------------------------


def role_group_create(workspace: Workspace, role: str) -> WorkspaceRoleGroup:
    """The guardian group of one role on ``workspace``, holding that role's permissions there."""
    group = Group.objects.create(name=f"ws-{workspace.pk}-{role}")
    role_group = WorkspaceRoleGroup.objects.create(workspace=workspace, role=role, group=group)
    for permission in WORKSPACE_ROLE_PERMISSIONS[role]:
        assign_perm(f"workspaces.{CODENAMES[permission]}", group, workspace)
    return role_group


def role_groups_create(workspace: Workspace) -> None:
    for role in WORKSPACE_ROLE_PERMISSIONS:
        role_group_create(workspace, role)


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
    role_groups_create(workspace)
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


def role_group_join(membership: WorkspaceMembership, old_role: str | None = None) -> None:
    """Move the member from ``old_role``'s group to their role's: what permission checks read."""
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
    role_group_join(membership, None)
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
        role_group_join(membership, old)
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
