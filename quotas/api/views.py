"""Capacity and workspace quotas. (A workspace's usage is jobs': jobs/api/usage.py.)"""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from quotas import selectors, services
from quotas.models import QuotaGroup
from workspaces import roles
from workspaces.api.idempotency import IDEMPOTENCY_KEY, idempotent
from workspaces.api.tenancy import TenantViewSet, WorkspaceViewSet

from . import serializers as s


class OrgQuotaViewSet(TenantViewSet):
    """The organisation's capacity and queueing policy (org owners and admins)."""

    serializer_class = s.OrgQuotaSerializer
    permission_map = {
        "retrieve": roles.ORG_VIEW,
        "tree": roles.ORG_VIEW,
        "update": roles.ORG_MANAGE,
        "partial_update": roles.ORG_MANAGE,
    }

    @extend_schema(operation_id="org_quota_retrieve")
    def retrieve(self, request, org=None):
        return Response(s.OrgQuotaSerializer(selectors.org_quota(self.organization)).data)

    @extend_schema(
        operation_id="org_quota_tree",
        responses=s.QuotaNodeOutput,
        description="The quota tree from the organisation down: each node's guaranteed, limit, "
        "lending limit and weight, what its subtree holds (usage) and borrows.",
    )
    def tree(self, request, org=None):
        return Response(selectors.quota_tree(self.organization))

    @extend_schema(
        operation_id="org_quota_replace",
        request=s.OrgQuotaReplaceInput,
        responses=s.OrgQuotaSerializer,
        description="Every field, null where unlimited; PATCH changes only the fields given.",
    )
    def update(self, request, org=None):
        return self._save(s.OrgQuotaReplaceInput(data=request.data))

    @extend_schema(operation_id="org_quota_update")
    def partial_update(self, request, org=None):
        return self._save(s.OrgQuotaSerializer(data=request.data, partial=True))

    def _save(self, data):
        data.is_valid(raise_exception=True)
        quota = services.org_quota_update(
            actor=self.actor, organization=self.organization, data=data.validated_data
        )
        return Response(s.OrgQuotaSerializer(quota).data)


class WorkspaceQuotaViewSet(WorkspaceViewSet):
    """A workspace's guarantees, limits and budget (members read; org admins write)."""

    serializer_class = s.WorkspaceQuotaSerializer
    permission_map = {
        "retrieve": roles.WS_VIEW,
        "update": roles.ORG_MANAGE,
        "partial_update": roles.ORG_MANAGE,
    }

    @extend_schema(operation_id="workspace_quota_retrieve")
    def retrieve(self, request, org=None, ws=None):
        return Response(s.WorkspaceQuotaSerializer(selectors.workspace_quota(self.workspace)).data)

    @extend_schema(
        operation_id="workspace_quota_replace",
        request=s.WorkspaceQuotaReplaceInput,
        responses=s.WorkspaceQuotaSerializer,
        description="Every field, null where unlimited; PATCH changes only the fields given.",
    )
    def update(self, request, org=None, ws=None):
        return self._save(s.WorkspaceQuotaReplaceInput(data=request.data, context=self._context()))

    @extend_schema(operation_id="workspace_quota_update")
    def partial_update(self, request, org=None, ws=None):
        return self._save(
            s.WorkspaceQuotaSerializer(data=request.data, partial=True, context=self._context())
        )

    def _context(self):
        return {"organization": self.organization}

    def _save(self, data):
        data.is_valid(raise_exception=True)
        quota = services.workspace_quota_update(
            actor=self.actor, workspace=self.workspace, data=data.validated_data
        )
        return Response(s.WorkspaceQuotaSerializer(quota).data)


class QuotaGroupViewSet(TenantViewSet):
    """The quota groups between the organisation and its workspaces (org owners and admins
    write; members read)."""

    serializer_class = s.QuotaGroupSerializer
    queryset = QuotaGroup.objects.none()
    organization_field = "organization"
    lookup_field = "name"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"
    not_found_message = "No such quota group."
    permission_map = {
        "list": roles.ORG_VIEW,
        "retrieve": roles.ORG_VIEW,
        "create": roles.ORG_MANAGE,
        "partial_update": roles.ORG_MANAGE,
        "destroy": roles.ORG_MANAGE,
    }

    def base_queryset(self):
        return QuotaGroup.objects.select_related("parent").order_by("name", "id")

    def _input(self, **kwargs):
        return s.QuotaGroupSerializer(
            data=self.request.data, context={"organization": self.organization}, **kwargs
        )

    @extend_schema(operation_id="quota_groups_list")
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.QuotaGroupSerializer(page, many=True).data)

    @extend_schema(operation_id="quota_groups_create", parameters=[IDEMPOTENCY_KEY],
                   responses={201: s.QuotaGroupSerializer})  # fmt: skip
    @idempotent
    def create(self, request, org=None):
        data = self._input()
        data.is_valid(raise_exception=True)
        group = services.quota_group_create(
            actor=self.actor, organization=self.organization, data=data.validated_data
        )
        return Response(s.QuotaGroupSerializer(group).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="quota_group_retrieve")
    def retrieve(self, request, org=None, name=None):
        return Response(s.QuotaGroupSerializer(self.get_object()).data)

    @extend_schema(operation_id="quota_group_update")
    def partial_update(self, request, org=None, name=None):
        group = self.get_object()
        data = self._input(partial=True)
        data.is_valid(raise_exception=True)
        group = services.quota_group_update(actor=self.actor, group=group, data=data.validated_data)
        return Response(s.QuotaGroupSerializer(group).data)

    @extend_schema(operation_id="quota_group_delete", responses={204: None})
    def destroy(self, request, org=None, name=None):
        services.quota_group_delete(actor=self.actor, group=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
