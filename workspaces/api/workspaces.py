"""Workspaces of an organisation, one workspace, and its members' role grants. Views only
translate: parse, call one service, render."""

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response

from workspaces import roles, selectors, services
from workspaces.models import Workspace, WorkspaceMembership

from . import serializers as s
from .idempotency import IDEMPOTENCY_KEY, idempotent
from .tenancy import TenantViewSet, WorkspaceViewSet


class WorkspaceListViewSet(TenantViewSet):
    """Workspaces of an organisation."""

    serializer_class = s.WorkspaceOutput
    queryset = Workspace.objects.none()
    organization_field = "organization"
    permission_map = {"list": roles.ORG_VIEW, "create": roles.ORG_MANAGE_WORKSPACES}

    def base_queryset(self):
        include = self.request.query_params.get("include_archived") in ("1", "true")
        return selectors.workspaces_visible_to(
            self.request.user, self.org_membership, include_archived=include
        )

    @extend_schema(
        operation_id="workspaces_list",
        parameters=[OpenApiParameter("include_archived", bool, description="Also archived ones")],
    )
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.WorkspaceOutput(page, many=True).data)

    @extend_schema(
        operation_id="workspaces_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.WorkspaceCreateInput,
        responses={201: s.WorkspaceOutput},
        examples=[
            OpenApiExample(
                "Create a workspace",
                value={"slug": "ml-research", "name": "ML research", "description": "Team A"},
                request_only=True,
            )
        ],
    )
    @idempotent
    def create(self, request, org=None):
        data = s.WorkspaceCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        workspace = services.workspace_create(
            actor=self.actor, organization=self.organization, **data.validated_data
        )
        return Response(s.WorkspaceOutput(workspace).data, status=status.HTTP_201_CREATED)


class WorkspaceDetailViewSet(WorkspaceViewSet):
    """One workspace; DELETE archives it."""

    serializer_class = s.WorkspaceOutput
    permission_map = {
        "retrieve": roles.WS_VIEW,
        "partial_update": roles.WS_MANAGE,
        "destroy": roles.ORG_MANAGE_WORKSPACES,
    }

    @extend_schema(operation_id="workspace_retrieve")
    def retrieve(self, request, org=None, ws=None):
        return Response(s.WorkspaceOutput(self.workspace).data)

    @extend_schema(
        operation_id="workspace_update", request=s.WorkspaceUpdateInput, responses=s.WorkspaceOutput
    )
    def partial_update(self, request, org=None, ws=None):
        data = s.WorkspaceUpdateInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        workspace = services.workspace_update(
            actor=self.actor, workspace=self.workspace, data=data.validated_data
        )
        return Response(s.WorkspaceOutput(workspace).data)

    @extend_schema(operation_id="workspace_archive", responses={204: None})
    def destroy(self, request, org=None, ws=None):
        services.workspace_archive(actor=self.actor, workspace=self.workspace)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemberViewSet(WorkspaceViewSet):
    """Role grants on a workspace."""

    serializer_class = s.MemberOutput
    queryset = WorkspaceMembership.objects.none()
    workspace_field = "workspace"
    not_found_message = "No such member."
    permission_map = {
        "list": roles.WS_VIEW,
        "create": roles.WS_MANAGE_MEMBERS,
        "partial_update": roles.WS_MANAGE_MEMBERS,
        "destroy": roles.WS_MANAGE_MEMBERS,
    }

    def base_queryset(self):
        return selectors.workspace_members(self.workspace)

    @extend_schema(operation_id="workspace_members_list")
    def list(self, request, org=None, ws=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.MemberOutput(page, many=True).data)

    @extend_schema(
        operation_id="workspace_members_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.MemberCreateInput,
        responses={201: s.MemberOutput},
    )
    @idempotent
    def create(self, request, org=None, ws=None):
        data = s.MemberCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.member_add(
            actor=self.actor, workspace=self.workspace, **data.validated_data
        )
        return Response(s.MemberOutput(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="workspace_members_update",
        request=s.MemberUpdateInput,
        responses=s.MemberOutput,
    )
    def partial_update(self, request, org=None, ws=None, pk=None):
        data = s.MemberUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.member_update(
            actor=self.actor, membership=self.get_object(), role=data.validated_data["role"]
        )
        return Response(s.MemberOutput(membership).data)

    @extend_schema(operation_id="workspace_members_remove", responses={204: None})
    def destroy(self, request, org=None, ws=None, pk=None):
        services.member_remove(actor=self.actor, membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
