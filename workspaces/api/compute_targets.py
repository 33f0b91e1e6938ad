"""Compute targets: where an organisation's jobs run. Views only translate: parse, call one
service, render."""

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import status
from rest_framework.response import Response

from workspaces import compute_targets as targets
from workspaces import roles
from workspaces.models import ComputeTarget

from . import serializers as s
from .idempotency import IDEMPOTENCY_KEY, idempotent
from .tenancy import TenantViewSet


class ComputeTargetViewSet(TenantViewSet):
    """Where an organisation's jobs run (``local`` exists implicitly in every org)."""

    serializer_class = s.ComputeTargetOutput
    queryset = ComputeTarget.objects.none()
    organization_field = "organization"
    not_found_message = "No such compute target."
    permission_map = {
        "list": roles.ORG_VIEW,
        "retrieve": roles.ORG_VIEW,
        "create": roles.ORG_MANAGE,
        "partial_update": roles.ORG_MANAGE,
        "destroy": roles.ORG_MANAGE,
    }

    def base_queryset(self):
        return ComputeTarget.objects.order_by("id")

    @extend_schema(operation_id="compute_targets_list")
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.ComputeTargetOutput(page, many=True).data)

    @extend_schema(
        operation_id="compute_targets_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.ComputeTargetCreateInput,
        responses={201: s.ComputeTargetOutput},
        examples=[
            OpenApiExample(
                "An existing Ray cluster",
                value={
                    "name": "shared-ray",
                    "kind": "ray",
                    "config": {"address": "http://127.0.0.1:8265", "token": "…"},
                },
                request_only=True,
            )
        ],
    )
    @idempotent
    def create(self, request, org=None):
        data = s.ComputeTargetCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        target = targets.compute_target_create(
            actor=self.actor, organization=self.organization, **data.validated_data
        )
        return Response(s.ComputeTargetOutput(target).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="compute_target_retrieve")
    def retrieve(self, request, org=None, pk=None):
        return Response(s.ComputeTargetOutput(self.get_object()).data)

    @extend_schema(
        operation_id="compute_target_update",
        request=s.ComputeTargetUpdateInput,
        responses=s.ComputeTargetOutput,
    )
    def partial_update(self, request, org=None, pk=None):
        target = self.get_object()
        data = s.ComputeTargetUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        config = s.validate_target_config(target.kind, data.validated_data["config"])
        updated = targets.compute_target_update(actor=self.actor, target=target, config=config)
        return Response(s.ComputeTargetOutput(updated).data)

    @extend_schema(operation_id="compute_target_delete", responses={204: None})
    def destroy(self, request, org=None, pk=None):
        targets.compute_target_delete(actor=self.actor, target=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
