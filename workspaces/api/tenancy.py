"""The one tenant base view.

It resolves ``org`` (and ``ws``) from the URL before any handler runs, answers 404 for anything the
principal may not see (a foreign tenant's object does not exist, as far as the caller can tell),
checks the permission the action declares (403), and hands out only scoped querysets.

Scoping is the base's job, not each view's: a view declares the field path from its model to the
organisation (``organization_field``) or to the workspace (``workspace_field``) and implements
``base_queryset()``; ``get_queryset()`` filters that by the URL's tenant, so a subclass cannot
forget the filter or widen it. Subclasses may not override ``get_queryset``, and a view with rows
but no scope declaration fails at import. Detail lookups go through ``get_object()`` over the
scoped queryset. The one way around the scope is to implement ``dangerously_get_queryset()``, a
name meant to be noticed in review.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Model, QuerySet
from rest_framework import exceptions, viewsets
from rest_framework.permissions import SAFE_METHODS

from audit.context import Actor
from config import strict
from config.prepared import PreparedRead
from workspaces import roles, selectors
from workspaces.archive import require_active
from workspaces.models import Organization, OrgMembership, Workspace

ARCHIVED_ALLOWED = frozenset({"cancel", "reject"})


def object_or_404(queryset: QuerySet, not_found: str, **lookup: Any) -> Model:
    """The row of ``queryset`` that ``lookup`` names, or a 404 whose detail is ``not_found``."""
    try:
        return queryset.get(**lookup)
    except ObjectDoesNotExist:
        raise exceptions.NotFound(not_found) from None


class TenantViewSetMixin:
    """Org-scoped. ``permission_map`` maps a viewset action (or an HTTP method, lower-case) to the
    org or workspace permission it needs; an action missing from the map is refused."""

    permission_map: dict[str, str] = {}
    # The field path from the view's model to its organisation ("organization",
    # "job__organization"): get_queryset() keeps the rows of the URL's organisation.
    organization_field: str | None = None
    # The same to its workspace; only a workspace view resolves one (WorkspaceViewSetMixin).
    workspace_field: str | None = None
    # The detail of the 404 a detail route answers for an object this tenant does not hold.
    not_found_message = "Not found."
    # When set, a lookup value that does not match it (a NUL, a path) is not looked up: 404.
    lookup_value_regex: str | None = None

    organization: Organization
    org_membership: OrgMembership
    org_perms: frozenset[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "get_queryset" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: implement base_queryset(), not get_queryset()")
        # Every action names the permission it needs: no entry means "refused", and there is no
        # value meaning "membership is enough" (name roles.WS_VIEW or roles.ORG_VIEW for that).
        unknown = {
            action: permission
            for action, permission in cls.permission_map.items()
            if permission not in roles.ALL_PERMISSIONS
        }
        if unknown:
            raise TypeError(f"{cls.__name__}: permission_map names no permission: {unknown}")
        problem = cls.scope_problem()
        if problem:
            raise TypeError(f"{cls.__name__}: {problem}")

    @classmethod
    def skips_scope(cls) -> bool:
        return cls.dangerously_get_queryset is not TenantViewSetMixin.dangerously_get_queryset

    @classmethod
    def has_rows(cls) -> bool:
        """Whether the view hands out rows the base must scope."""
        if cls.skips_scope():
            return False
        overridden = cls.base_queryset is not TenantViewSetMixin.base_queryset
        return overridden or getattr(cls, "queryset", None) is not None

    @classmethod
    def scope_problem(cls) -> str | None:
        """Why this class's rows would not be scoped to the URL's organisation (None: they are)."""
        if cls.workspace_field is not None:
            return "an organisation-level view resolves no workspace to filter workspace_field by"
        if cls.has_rows() and not cls.organization_field:
            return "it has a queryset but declares no organization_field to scope it by"
        return None

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

    def base_queryset(self) -> QuerySet:
        """The view's rows before the tenant scope: what to select, join and order, and any
        filter of the view's own. It need not filter by tenant; get_queryset() does."""
        raise NotImplementedError

    def dangerously_get_queryset(self) -> QuerySet:
        """Implemented only by a view whose rows are not its tenant's (none is today): its
        queryset is then handed out as it is, unscoped."""
        raise NotImplementedError

    def scope(self) -> dict[str, Any]:
        """The filter that keeps the rows of the URL's tenant."""
        if self.organization_field:
            return {self.organization_field: self.organization}
        return {}

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no tenant
            return self.queryset.none()  # type: ignore[attr-defined]
        if self.skips_scope():
            return self.dangerously_get_queryset()
        return self.base_queryset().filter(**self.scope())

    def get_object(self) -> Model:
        """The object the URL names, from the scoped queryset; 404 with ``not_found_message``
        when this tenant holds none. Query-string filters are for lists: unlike DRF's, this
        lookup ignores them."""
        kwarg = self.lookup_url_kwarg or self.lookup_field  # type: ignore[attr-defined]
        value = self.kwargs[kwarg]  # type: ignore[attr-defined]
        if self.lookup_value_regex and not re.fullmatch(self.lookup_value_regex, str(value)):
            raise exceptions.NotFound(self.not_found_message)
        lookup = {self.lookup_field: value}  # type: ignore[attr-defined]
        found = object_or_404(self.get_queryset(), self.not_found_message, **lookup)
        self.check_object_permissions(self.request, found)  # type: ignore[attr-defined]
        return found

    @property
    def actor(self) -> Actor:
        return Actor.from_request(self.request)


# Each workspace view's read of its workspace, by view class and action.
_WORKSPACE_READS: dict[tuple, PreparedRead] = {}


class WorkspaceViewSetMixin(TenantViewSetMixin):
    """Workspace-scoped: also resolves ``ws``; a workspace without any permission there is 404."""

    workspace: Workspace
    ws_perms: frozenset[str]

    def workspace_queryset(self) -> QuerySet[Workspace]:
        """Where the URL's workspace is read from, before the tenant filter: a view whose action
        needs rows hanging off the workspace may join them here, in the same statement. It may
        depend on the view's class and action, nothing else: it is compiled once per class and
        action (:meth:`workspace_read`)."""
        return Workspace.objects.select_related("organization")

    def workspace_read(self) -> PreparedRead:
        """The URL's workspace by organisation id and slug: every workspace request makes this
        read, compiled once per connection (config/prepared.py)."""
        key = (type(self), getattr(self, "action", None))
        read = _WORKSPACE_READS.get(key)
        if read is None:
            workspaces = self.workspace_queryset()

            def by_slug(org_id: int, slug: str) -> QuerySet[Workspace]:
                return workspaces.filter(organization_id=org_id, slug=slug).order_by("pk")[:1]

            read = _WORKSPACE_READS[key] = PreparedRead(by_slug, int, str)
        return read

    def resolve_tenant(self, request, kwargs: dict[str, Any]) -> None:
        super().resolve_tenant(request, kwargs)
        workspace = self.workspace_read().first(self.organization.pk, kwargs["ws"])
        perms = (
            selectors.workspace_permissions(request.user, workspace, self.org_membership)
            if workspace is not None
            else frozenset()
        )
        if not perms:
            raise exceptions.NotFound("No such workspace.")
        self.workspace = workspace
        self.ws_perms = perms

    @classmethod
    def scope_problem(cls) -> str | None:
        # The organisation alone would let every workspace's rows of the org through.
        if cls.has_rows() and not cls.workspace_field:
            return "it has a queryset but declares no workspace_field to scope it by"
        return None

    def scope(self) -> dict[str, Any]:
        scope = super().scope()
        if self.workspace_field:
            scope[self.workspace_field] = self.workspace
        return scope

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
