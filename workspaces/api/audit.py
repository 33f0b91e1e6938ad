"""The organisation's audit log over HTTP: list, export and verify (org owners and admins).

Here rather than in ``audit/``: the tenant base view it stands on is workspaces', and audit sits
below workspaces.
"""

import csv
import io
import json

import django_filters
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from audit.chain import org_chain, verify_chain
from audit.models import AuditEvent
from audit.selectors import audit_events_for_org
from config.errors import InvalidInput
from config.filters import UtcDateTimeFilter
from config.pagination import CursorPagination
from workspaces import roles
from workspaces.api.tenancy import TenantViewSet


class AuditEventOutput(serializers.ModelSerializer):
    workspace = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    actor = serializers.SerializerMethodField()
    target = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvent
        fields = [
            "id", "seq", "occurred_at", "action", "actor", "target", "workspace", "changes",
            "metadata", "request_id", "ip", "user_agent", "prev_hash", "hash", "hash_version",
        ]  # fmt: skip

    def get_actor(self, event) -> dict:
        return {"type": event.actor_type, "id": event.actor_id, "label": event.actor_label,
                "token_id": event.actor_token_id}  # fmt: skip

    def get_target(self, event) -> dict:
        return {"type": event.target_type, "id": event.target_id, "repr": event.target_repr}


class VerifyOutput(serializers.Serializer):
    chain = serializers.CharField()
    checked = serializers.IntegerField()
    ok = serializers.BooleanField()
    first_broken = serializers.DictField(allow_null=True)


class AuditEventFilter(django_filters.FilterSet):
    action = django_filters.CharFilter(help_text="Exact action, or a prefix ending in '.'",
                                       method="filter_action")  # fmt: skip
    actor = django_filters.CharFilter(field_name="actor_label", help_text="Actor email or label")
    workspace = django_filters.CharFilter(field_name="workspace__slug")
    target_type = django_filters.CharFilter()
    target_id = django_filters.CharFilter()
    request_id = django_filters.CharFilter()
    since = UtcDateTimeFilter(field_name="occurred_at", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="occurred_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = []

    def filter_action(self, queryset, name, value):
        if value.endswith("."):
            return queryset.filter(action__startswith=value)
        return queryset.filter(action=value)


EXPORT_FIELDS = ["id", "seq", "occurred_at", "action", "actor_type", "actor_label",
                 "target_type", "target_id", "target_repr", "workspace", "changes",
                 "request_id", "ip", "hash", "hash_version"]  # fmt: skip


class AuditEventViewSet(TenantViewSet):
    """The organisation's audit log (org owners and admins)."""

    serializer_class = AuditEventOutput
    queryset = AuditEvent.objects.none()
    organization_field = "organization"
    filterset_class = AuditEventFilter
    pagination_class = CursorPagination  # a long list, read deep by exports and SIEMs
    permission_map = {"list": roles.ORG_VIEW_AUDIT, "verify": roles.ORG_VIEW_AUDIT,
                      "export": roles.ORG_VIEW_AUDIT}  # fmt: skip

    def base_queryset(self):
        return audit_events_for_org(organization=self.organization)

    @extend_schema(operation_id="audit_events_list")
    def list(self, request, org=None):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(AuditEventOutput(page, many=True).data)

    @extend_schema(operation_id="audit_events_verify", responses=VerifyOutput)
    def verify(self, request, org=None):
        result = verify_chain(org_chain(self.organization.pk))
        return Response(VerifyOutput(result.as_dict()).data)

    @extend_schema(
        operation_id="audit_events_export",
        parameters=[OpenApiParameter("format", str, enum=["jsonl", "csv"])],
        responses={(200, "application/x-ndjson"): str, (200, "text/csv"): str},
    )
    def export(self, request, org=None):
        fmt = request.query_params.get("format", "jsonl")
        if fmt not in ("jsonl", "csv"):
            raise InvalidInput.on("format", "must be 'jsonl' or 'csv'")
        rows = self.filter_queryset(self.get_queryset()).order_by("id")

        def row(event):
            data = {name: getattr(event, name) for name in EXPORT_FIELDS if name != "workspace"}
            data["occurred_at"] = event.occurred_at.isoformat()
            data["workspace"] = event.workspace.slug if event.workspace else None
            return data

        def jsonl():
            for event in rows.iterator(chunk_size=1000):
                yield json.dumps(row(event), default=str) + "\n"

        def csv_rows():
            buffer = io.StringIO()
            writer = csv.DictWriter(buffer, fieldnames=EXPORT_FIELDS)
            writer.writeheader()
            for event in rows.iterator(chunk_size=1000):
                data = row(event)
                data["changes"] = json.dumps(data["changes"], default=str)
                writer.writerow(data)
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
            yield buffer.getvalue()

        content_type = "application/x-ndjson" if fmt == "jsonl" else "text/csv"
        response = StreamingHttpResponse(jsonl() if fmt == "jsonl" else csv_rows(),
                                         content_type=content_type)  # fmt: skip
        filename = f"audit-{self.organization.slug}.{fmt}"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response
