"""The one tenant base view.

It resolves ``org`` (and ``ws``) from the URL before any handler runs, answers 404 for anything the
principal may not see (a foreign tenant's object does not exist, as far as the caller can tell),
checks the permission the action declares (403), and hands out only scoped querysets. Subclasses
may not override ``get_queryset``: they implement ``scoped_queryset()``, which runs after the
checks, so there is no unscoped path to forget.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import exceptions, viewsets
from rest_framework.permissions import SAFE_METHODS

from audit.context import Actor
from config import strict
from workspaces import roles, selectors
from workspaces.archive import require_active
from workspaces.models import Organization, OrgMembership, Workspace

ARCHIVED_ALLOWED = frozenset({"cancel", "reject"})


class TenantViewSetMixin:
    """Org-scoped. ``permission_map`` maps a viewset action (or an HTTP method, lower-case) to the
    org or workspace permission it needs; an action missing from the map is refused."""

    permission_map: dict[str, str] = {}

    organization: Organization
    org_membership: OrgMembership
    org_perms: frozenset[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "get_queryset" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: implement scoped_queryset(), not get_queryset()")
        # Every action names the permission it needs: no entry means "refused", and there is no
        # value meaning "membership is enough" (name roles.WS_VIEW or roles.ORG_VIEW for that).
        unknown = {
            action: permission
            for action, permission in cls.permission_map.items()
            if permission not in roles.ALL_PERMISSIONS
        }
        if unknown:
            raise TypeError(f"{cls.__name__}: permission_map names no permission: {unknown}")

    # --- resolution ---------------------------------------------------------------------------

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # authentication and IsAuthenticated first
        self.resolve_tenant(request, kwargs)
        self.check_action_permission()
        strict.refuse_unexpected_body(request, self)

    def resolve_tenant(self, request, kwargs: dict[str, Any]) -> None:
        membership = selectors.org_membership(request.user, kwargs["org"])
        if membership is None:
            raise exceptions.NotFound("No such organisation.")
        self.org_membership = membership
        self.organization = membership.organization
        self.org_perms = selectors.org_permissions(membership)

    def held_permissions(self) -> frozenset[str]:
        return self.org_perms

    def required_permission(self) -> str:
        key = getattr(self, "action", None) or self.request.method.lower()
        if key not in self.permission_map:
            key = self.request.method.lower()
        if key not in self.permission_map:
            raise exceptions.MethodNotAllowed(self.request.method)
        return self.permission_map[key]

    def check_action_permission(self) -> None:
        required = self.required_permission()
        if required not in self.held_permissions():
            raise exceptions.PermissionDenied(f"This action needs the {required!r} permission.")

    def has_perm(self, permission: str) -> bool:
        return permission in self.held_permissions()

    # --- querysets ----------------------------------------------------------------------------

    def scoped_queryset(self) -> QuerySet:
        raise NotImplementedError

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no tenant
            return self.queryset.none()  # type: ignore[attr-defined]
        return self.scoped_queryset()

    @property
    def actor(self) -> Actor:
        return Actor.from_request(self.request)


class WorkspaceViewSetMixin(TenantViewSetMixin):
    """Workspace-scoped: also resolves ``ws``; a workspace without any permission there is 404."""

    workspace: Workspace
    ws_perms: frozenset[str]

    def resolve_tenant(self, request, kwargs: dict[str, Any]) -> None:
        super().resolve_tenant(request, kwargs)
        workspace = (
            Workspace.objects.select_related("organization")
            .filter(organization=self.organization, slug=kwargs["ws"])
            .first()
        )
        perms = (
            selectors.workspace_permissions(request.user, workspace, self.org_membership)
            if workspace is not None
            else frozenset()
        )
        if not perms:
            raise exceptions.NotFound("No such workspace.")
        self.workspace = workspace
        self.ws_perms = perms

    def held_permissions(self) -> frozenset[str]:
        return self.org_perms | self.ws_perms

    def check_action_permission(self) -> None:
        super().check_action_permission()
        # An archived workspace is read-only; rejecting and cancelling jobs stay possible, as
        # they only stop work.
        action = getattr(self, "action", None)
        if self.request.method not in SAFE_METHODS and action not in ARCHIVED_ALLOWED:
            require_active(self.workspace)


class TenantViewSet(TenantViewSetMixin, viewsets.GenericViewSet):
    pass


class WorkspaceViewSet(WorkspaceViewSetMixin, viewsets.GenericViewSet):
    pass
