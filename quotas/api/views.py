"""Capacity and workspace quotas. (A workspace's usage is jobs': jobs/api/usage.py.)"""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from quotas import selectors, services
from workspaces import roles
from workspaces.api.tenancy import TenantViewSet, WorkspaceViewSet

from . import serializers as s


class OrgQuotaViewSet(TenantViewSet):
    """The organisation's capacity and queueing policy (org owners and admins)."""

    serializer_class = s.OrgQuotaSerializer
    permission_map = {
        "retrieve": roles.ORG_VIEW,
        "update": roles.ORG_MANAGE,
        "partial_update": roles.ORG_MANAGE,
    }

    @extend_schema(operation_id="org_quota_retrieve")
    def retrieve(self, request, org=None):
        return Response(s.OrgQuotaSerializer(selectors.org_quota(self.organization)).data)

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
        return self._save(s.WorkspaceQuotaReplaceInput(data=request.data))

    @extend_schema(operation_id="workspace_quota_update")
    def partial_update(self, request, org=None, ws=None):
        return self._save(s.WorkspaceQuotaSerializer(data=request.data, partial=True))

    def _save(self, data):
        data.is_valid(raise_exception=True)
        quota = services.workspace_quota_update(
            actor=self.actor, workspace=self.workspace, data=data.validated_data
        )
        return Response(s.WorkspaceQuotaSerializer(quota).data)
