"""Code sources of a workspace: git repositories jobs run code from (``spec.code``)."""

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import status
from rest_framework.response import Response

from packages import sources
from packages.models import CodeSource
from workspaces import roles
from workspaces.api.idempotency import IDEMPOTENCY_KEY, idempotent
from workspaces.api.tenancy import WorkspaceViewSet

from . import serializers as s


class CodeSourceViewSet(WorkspaceViewSet):
    queryset = CodeSource.objects.none()
    workspace_field = "workspace"
    lookup_field = "name"
    not_found_message = "No such code source in this workspace."
    serializer_class = s.CodeSourceOutput
    permission_map = {
        "list": roles.WS_VIEW,
        "retrieve": roles.WS_VIEW,
        "create": roles.WS_MANAGE_TEMPLATES,
        "partial_update": roles.WS_MANAGE_TEMPLATES,
        "destroy": roles.WS_MANAGE_TEMPLATES,
    }

    def base_queryset(self):
        return CodeSource.objects.select_related("created_by")

    @extend_schema(operation_id="code_sources_list")
    def list(self, request, org=None, ws=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.CodeSourceOutput(page, many=True).data)

    @extend_schema(
        operation_id="code_sources_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.CodeSourceCreateInput,
        responses={201: s.CodeSourceOutput},
        examples=[
            OpenApiExample(
                "A repository on GitHub",
                value={"name": "trainer", "url": "https://github.com/acme/trainer.git"},
                request_only=True,
            )
        ],
    )
    @idempotent
    def create(self, request, org=None, ws=None):
        data = s.CodeSourceCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        source = sources.source_create(
            actor=self.actor, workspace=self.workspace, **data.validated_data
        )
        return Response(s.CodeSourceOutput(source).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="code_source_retrieve")
    def retrieve(self, request, org=None, ws=None, name=None):
        return Response(s.CodeSourceOutput(self.get_object()).data)

    @extend_schema(
        operation_id="code_source_update",
        request=s.CodeSourceUpdateInput,
        responses=s.CodeSourceOutput,
    )
    def partial_update(self, request, org=None, ws=None, name=None):
        source = self.get_object()
        data = s.CodeSourceUpdateInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        updated = sources.source_update(actor=self.actor, source=source, data=data.validated_data)
        return Response(s.CodeSourceOutput(updated).data)

    @extend_schema(operation_id="code_source_delete", responses={204: None})
    def destroy(self, request, org=None, ws=None, name=None):
        sources.source_delete(actor=self.actor, source=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
