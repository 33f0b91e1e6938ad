"""A workspace's usage: what its jobs hold and run against its quota, and its GPU-hours."""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from jobs import accounting
from quotas.api.serializers import UsageOutput
from workspaces import roles
from workspaces.api.tenancy import WorkspaceViewSet


class WorkspaceUsageView(WorkspaceViewSet):
    """Members read their workspace's usage."""

    serializer_class = UsageOutput
    permission_map = {"retrieve": roles.WS_VIEW}

    @extend_schema(operation_id="workspace_usage_retrieve", responses=UsageOutput)
    def retrieve(self, request, org=None, ws=None):
        return Response(UsageOutput(accounting.usage(self.workspace)).data)
