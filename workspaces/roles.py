"""Roles are data: the one table from role to permission.

Views declare the permission an action needs (``"workspace.submit_job"``), never a role. Workspace
permissions are guardian object permissions on the Workspace, granted to one group per workspace
role; org owners and admins hold every workspace permission in every workspace of their org.
"""

from __future__ import annotations

from .models import OrgRole, WorkspaceRole

# Workspace permission names as views use them → the Workspace Meta.permissions codename.
WS_VIEW = "workspace.view"
WS_MANAGE = "workspace.manage"
WS_MANAGE_MEMBERS = "workspace.manage_members"
WS_MANAGE_TEMPLATES = "workspace.manage_templates"
WS_SUBMIT_JOB = "workspace.submit_job"
WS_CANCEL_OWN_JOB = "workspace.cancel_own_job"
WS_CANCEL_ANY_JOB = "workspace.cancel_any_job"
WS_APPROVE_JOB = "workspace.approve_job"
WS_MANAGE_WEBHOOKS = "workspace.manage_webhooks"

CODENAMES = {
    WS_VIEW: "view_workspace",
    WS_MANAGE: "manage_workspace",
    WS_MANAGE_MEMBERS: "manage_members",
    WS_MANAGE_TEMPLATES: "manage_templates",
    WS_SUBMIT_JOB: "submit_job",
    WS_CANCEL_OWN_JOB: "cancel_own_job",
    WS_CANCEL_ANY_JOB: "cancel_any_job",
    WS_APPROVE_JOB: "approve_job",
    WS_MANAGE_WEBHOOKS: "manage_webhooks",
}
PERMISSION_BY_CODENAME = {codename: perm for perm, codename in CODENAMES.items()}

WORKSPACE_ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    WorkspaceRole.VIEWER: frozenset({WS_VIEW}),
    WorkspaceRole.DEVELOPER: frozenset({WS_VIEW, WS_SUBMIT_JOB, WS_CANCEL_OWN_JOB}),
    WorkspaceRole.ADMIN: frozenset(CODENAMES),
}

# Org-level permissions.
ORG_VIEW = "org.view"
ORG_MANAGE = "org.manage"  # edit the org, its quota and compute targets
ORG_MANAGE_USERS = "org.manage_users"
ORG_MANAGE_WORKSPACES = "org.manage_workspaces"
ORG_VIEW_AUDIT = "org.view_audit"
ORG_MANAGE_WEBHOOKS = "org.manage_webhooks"

_ORG_ADMIN = frozenset(
    {
        ORG_VIEW,
        ORG_MANAGE,
        ORG_MANAGE_USERS,
        ORG_MANAGE_WORKSPACES,
        ORG_VIEW_AUDIT,
        ORG_MANAGE_WEBHOOKS,
    }
)
ORG_ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    OrgRole.OWNER: _ORG_ADMIN,
    OrgRole.ADMIN: _ORG_ADMIN,
    OrgRole.MEMBER: frozenset({ORG_VIEW}),
}

# Org roles that act as workspace admin everywhere in their org.
ORG_ROLES_ADMINISTERING_WORKSPACES = frozenset({OrgRole.OWNER, OrgRole.ADMIN})

# Every permission a view may name.
ALL_PERMISSIONS = frozenset(CODENAMES) | _ORG_ADMIN
