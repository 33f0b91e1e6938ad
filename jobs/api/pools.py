"""Warm pools of an organisation's local and kuberay compute targets: org admins size them, org
members see them (size, idle and claimed clusters, hits, misses, ages). Views only translate."""

from __future__ import annotations

from django.db.models import Count, Min, Q
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from config.strict import StrictSerializer
from workspaces import roles
from workspaces.api.tenancy import TenantViewSet

from .. import pools
from ..models import WarmClusterState, WarmPool

S = WarmClusterState


class WarmPoolCreateInput(StrictSerializer):
    target_name = serializers.CharField(max_length=64, default="local")
    spec = serializers.JSONField(help_text="the cluster's shape: image, head, worker_groups")
    size = serializers.IntegerField(default=0, help_text="clusters kept started ahead of need")
    idle_timeout_seconds = serializers.IntegerField(default=600)
    workspace = serializers.CharField(
        max_length=64,
        required=False,
        allow_blank=True,
        default="",
        help_text="kuberay: the workspace whose namespace (the target's namespace_pattern) the "
        "pool's RayClusters live in; its jobs, and those of workspaces of the same namespace, "
        "take them",
    )
    gpu_flavor = serializers.CharField(
        max_length=32,
        required=False,
        allow_blank=True,
        default="",
        help_text="kuberay: the GPU flavor whose nodes the pool's GPU pods go to",
    )


class WarmPoolUpdateInput(StrictSerializer):
    size = serializers.IntegerField(required=False)
    idle_timeout_seconds = serializers.IntegerField(required=False)


class WarmPoolOutput(serializers.ModelSerializer):
    starting = serializers.IntegerField(read_only=True)
    idle = serializers.IntegerField(read_only=True)
    claimed = serializers.IntegerField(read_only=True)
    retiring = serializers.IntegerField(read_only=True)
    oldest_idle_age_seconds = serializers.SerializerMethodField()

    class Meta:
        model = WarmPool
        fields = [
            "id",
            "target_name",
            "kind",
            "namespace",
            "gpu_flavor",
            "spec",
            "shape_key",
            "size",
            "idle_timeout_seconds",
            "cpu",
            "memory_gb",
            "gpu",
            "disk_gb",
            "starting",
            "idle",
            "claimed",
            "retiring",
            "oldest_idle_age_seconds",
            "hits",
            "misses",
            "created_at",
            "updated_at",
        ]

    def get_oldest_idle_age_seconds(self, pool) -> float | None:
        ready = getattr(pool, "oldest_idle", None)
        return None if ready is None else round((timezone.now() - ready).total_seconds(), 1)


def with_levels(queryset):
    """Pools with how many of their clusters are in each state (one query however many)."""

    def count(state):
        return Count("clusters", filter=Q(clusters__state=state))

    return queryset.annotate(
        starting=count(S.STARTING),
        idle=count(S.IDLE),
        claimed=count(S.CLAIMED),
        retiring=count(S.RETIRING),
        oldest_idle=Min("clusters__ready_at", filter=Q(clusters__state=S.IDLE)),
    )


class WarmPoolViewSet(TenantViewSet):
    """Warm pools: clusters of one shape started ahead of need on a local or kuberay target."""

    serializer_class = WarmPoolOutput
    queryset = WarmPool.objects.none()
    organization_field = "organization"
    not_found_message = "No such warm pool."
    permission_map = {
        "list": roles.ORG_VIEW,
        "retrieve": roles.ORG_VIEW,
        "create": roles.ORG_MANAGE,
        "partial_update": roles.ORG_MANAGE,
    }

    def base_queryset(self):
        return with_levels(WarmPool.objects.order_by("id"))

    @extend_schema(operation_id="warm_pools_list")
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(WarmPoolOutput(page, many=True).data)

    @extend_schema(
        operation_id="warm_pools_create",
        request=WarmPoolCreateInput,
        responses={201: WarmPoolOutput},
    )
    def create(self, request, org=None):
        data = WarmPoolCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        pool = pools.pool_create(
            actor=self.actor, organization=self.organization, **data.validated_data
        )
        pool = self.get_queryset().get(pk=pool.pk)
        return Response(WarmPoolOutput(pool).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="warm_pool_retrieve")
    def retrieve(self, request, org=None, pk=None):
        return Response(WarmPoolOutput(self.get_object()).data)

    @extend_schema(
        operation_id="warm_pool_update", request=WarmPoolUpdateInput, responses=WarmPoolOutput
    )
    def partial_update(self, request, org=None, pk=None):
        pool = self.get_object()
        data = WarmPoolUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        pools.pool_update(actor=self.actor, pool=pool, data=data.validated_data)
        return Response(WarmPoolOutput(self.get_queryset().get(pk=pool.pk)).data)
