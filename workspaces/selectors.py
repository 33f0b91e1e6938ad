"""Reads, always scoped to what a principal may see."""

from __future__ import annotations

from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from guardian.models import GroupObjectPermission

from config.prepared import PreparedRead

from .models import (
    EMAIL_CATEGORIES,
    ApiToken,
    Organization,
    OrgMembership,
    User,
    Workspace,
    WorkspaceMembership,
)
from .roles import (
    CODENAMES,
    ORG_ROLE_PERMISSIONS,
    ORG_ROLES_ADMINISTERING_WORKSPACES,
    PERMISSION_BY_CODENAME,
)


def orgs_visible_to(user: User) -> QuerySet[Organization]:
    return Organization.objects.filter(memberships__user=user).order_by("id")


# The reads every tenant request makes, compiled once per connection (config/prepared.py).
_MEMBERSHIP = PreparedRead(
    lambda user_id, org_slug: (
        OrgMembership.objects.select_related("organization")
        .filter(user_id=user_id, organization__slug=org_slug)
        .order_by("pk")[:1]
    ),
    int,
    str,
)
_GROUP_CODENAMES = PreparedRead(
    lambda user_id, content_type_id, object_pk: GroupObjectPermission.objects.filter(
        group__user=user_id, content_type_id=content_type_id, object_pk=object_pk
    ).values_list("permission__codename", flat=True),
    int,
    int,
    str,
)


def org_membership(user: User, org_slug: str) -> OrgMembership | None:
    return _MEMBERSHIP.first(user.pk, org_slug)


def org_permissions(membership: OrgMembership) -> frozenset[str]:
    return ORG_ROLE_PERMISSIONS[membership.role]


def workspace_permissions(
    user: User, workspace: Workspace, membership: OrgMembership
) -> frozenset[str]:
    """The workspace permissions ``user`` holds: all of them for an org owner/admin, otherwise
    those of the guardian groups the user is in for this workspace (one indexed query)."""
    if membership.role in ORG_ROLES_ADMINISTERING_WORKSPACES:
        return frozenset(CODENAMES)
    codenames = _GROUP_CODENAMES.rows(
        user.pk, ContentType.objects.get_for_model(Workspace).pk, str(workspace.pk)
    )
    return frozenset(PERMISSION_BY_CODENAME[c] for c in codenames if c in PERMISSION_BY_CODENAME)


def workspaces_visible_to(
    user: User, membership: OrgMembership, *, include_archived: bool = False
) -> QuerySet[Workspace]:
    qs = Workspace.objects.filter(organization=membership.organization).select_related(
        "organization"
    )
    if membership.role not in ORG_ROLES_ADMINISTERING_WORKSPACES:
        qs = qs.filter(memberships__user=user)
    if not include_archived:
        qs = qs.filter(archived_at__isnull=True)
    return qs.order_by("id")


def workspace_members(workspace: Workspace) -> QuerySet[WorkspaceMembership]:
    return (
        WorkspaceMembership.objects.filter(workspace=workspace)
        .select_related("user")
        .order_by("id")
    )


def org_users(organization: Organization) -> QuerySet[OrgMembership]:
    return (
        OrgMembership.objects.filter(organization=organization)
        .select_related("user")
        .order_by("id")
    )


def tokens_of(user: User) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("id")


def notification_preferences_of(user: User) -> dict[str, bool]:
    """Every email category and whether ``user`` gets it (absent from the stored dict = on)."""
    stored = user.notification_preferences or {}
    return {category: bool(stored.get(category, True)) for category in EMAIL_CATEGORIES}
