"""Webhook endpoints of a workspace (workspace admins) and of an organisation (org admins).
Views only translate: parse, call one service, render."""

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from notifications import selectors, services
from notifications.models import WebhookDelivery, WebhookEndpoint
from workspaces import roles
from workspaces.api.idempotency import IDEMPOTENCY_KEY, idempotent
from workspaces.api.tenancy import TenantViewSet, WorkspaceViewSet, object_or_404

from . import serializers as s

ACTIONS = ("list", "retrieve", "create", "partial_update", "destroy", "rotate_secret", "ping",
           "deliveries", "delivery", "redeliver")  # fmt: skip


def webhook_schema(prefix: str, where: str):
    """The OpenAPI description of one family of webhook routes; ``prefix`` keeps the two
    families' operation ids apart (``webhook_create`` and ``org_webhook_create``)."""
    return extend_schema_view(
        list=extend_schema(operation_id=f"{prefix}webhooks_list", summary=f"{where} endpoints"),
        create=extend_schema(
            operation_id=f"{prefix}webhook_create",
            parameters=[IDEMPOTENCY_KEY],
            request=s.WebhookCreateInput,
            responses={201: s.WebhookCreatedOutput},
            description="The URL must be https:// and resolve to public addresses only; the "
            "response carries the signing secret, which is not shown again.",
        ),
        retrieve=extend_schema(operation_id=f"{prefix}webhook_retrieve"),
        partial_update=extend_schema(
            operation_id=f"{prefix}webhook_update",
            request=s.WebhookUpdateInput,
            responses=s.WebhookOutput,
        ),
        destroy=extend_schema(operation_id=f"{prefix}webhook_delete", responses={204: None}),
        rotate_secret=extend_schema(
            operation_id=f"{prefix}webhook_rotate_secret",
            request=s.RotateSecretInput,
            responses=s.RotateSecretOutput,
            description="A new secret; the current ones keep signing for the grace period, so "
            "messages carry two signatures until it ends.",
        ),
        ping=extend_schema(
            operation_id=f"{prefix}webhook_ping",
            request=None,
            responses={202: s.WebhookDeliveryOutput},
            description="Queue a webhook.ping message; follow it in deliveries/.",
        ),
        deliveries=extend_schema(
            operation_id=f"{prefix}webhook_deliveries_list",
            responses=s.WebhookDeliveryOutput(many=True),
        ),
        delivery=extend_schema(
            operation_id=f"{prefix}webhook_delivery_retrieve", responses=s.WebhookDeliveryOutput
        ),
        redeliver=extend_schema(
            operation_id=f"{prefix}webhook_delivery_redeliver",
            request=None,
            responses={202: s.WebhookDeliveryOutput},
            description="Send it again now, with the same webhook-id and a fresh retry schedule.",
        ),
    )


class WebhookActions:
    """The actions both families share; the tenant base view supplies the scoping."""

    queryset = WebhookEndpoint.objects.none()
    serializer_class = s.WebhookOutput
    not_found_message = "No such webhook endpoint."

    def _delivery(self, endpoint: WebhookEndpoint, delivery_id) -> WebhookDelivery:
        """A delivery of ``endpoint``, itself from the scoped queryset."""
        return object_or_404(selectors.deliveries_of(endpoint), "No such delivery.", pk=delivery_id)

    def _workspace(self):
        return None

    def list(self, request, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.WebhookOutput(page, many=True).data)

    @idempotent
    def create(self, request, **kwargs):
        data = s.WebhookCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint, secret = services.webhook_create(
            actor=self.actor,
            organization=self.organization,
            workspace=self._workspace(),
            **data.validated_data,
        )
        endpoint.secret = secret
        return Response(s.WebhookCreatedOutput(endpoint).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request, pk=None, **kwargs):
        return Response(s.WebhookOutput(self.get_object()).data)

    def partial_update(self, request, pk=None, **kwargs):
        data = s.WebhookUpdateInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        endpoint = services.webhook_update(
            actor=self.actor, endpoint=self.get_object(), data=dict(data.validated_data)
        )
        # Read again through the view's queryset: the output needs its joins.
        return Response(s.WebhookOutput(self.get_queryset().get(pk=endpoint.pk)).data)

    def destroy(self, request, pk=None, **kwargs):
        services.webhook_delete(actor=self.actor, endpoint=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request, pk=None, **kwargs):
        data = s.RotateSecretInput(data=request.data)
        data.is_valid(raise_exception=True)
        secret, expires = services.webhook_rotate_secret(
            actor=self.actor,
            endpoint=self.get_object(),
            grace_period_seconds=data.validated_data.get("grace_period_seconds"),
        )
        body = {"secret": secret, "previous_secrets_expire_at": expires}
        return Response(s.RotateSecretOutput(body).data)

    @action(detail=True, methods=["post"])
    def ping(self, request, pk=None, **kwargs):
        endpoint = self.get_object()
        delivery = services.webhook_ping(actor=self.actor, endpoint=endpoint)
        rendered = s.WebhookDeliveryOutput(self._delivery(endpoint, delivery.pk)).data
        return Response(rendered, status=status.HTTP_202_ACCEPTED)

    @action(detail=True)
    def deliveries(self, request, pk=None, **kwargs):
        page = self.paginate_queryset(selectors.deliveries_of(self.get_object()))
        return self.get_paginated_response(s.WebhookDeliveryOutput(page, many=True).data)

    @action(detail=True)
    def delivery(self, request, pk=None, delivery_id=None, **kwargs):
        delivery = self._delivery(self.get_object(), delivery_id)
        return Response(s.WebhookDeliveryOutput(delivery).data)

    @action(detail=True, methods=["post"])
    def redeliver(self, request, pk=None, delivery_id=None, **kwargs):
        endpoint = self.get_object()
        delivery = services.delivery_redeliver(
            actor=self.actor, delivery=self._delivery(endpoint, delivery_id)
        )
        rendered = s.WebhookDeliveryOutput(self._delivery(endpoint, delivery.pk)).data
        return Response(rendered, status=status.HTTP_202_ACCEPTED)


@webhook_schema("", "The workspace's")
class WorkspaceWebhookViewSet(WebhookActions, WorkspaceViewSet):
    """Webhook endpoints that receive one workspace's events."""

    workspace_field = "workspace"
    permission_map = dict.fromkeys(ACTIONS, roles.WS_MANAGE_WEBHOOKS)

    def base_queryset(self):
        return selectors.endpoints_of(self.organization, self.workspace)

    def _workspace(self):
        return self.workspace


@webhook_schema("org_", "The organisation-level")
class OrgWebhookViewSet(WebhookActions, TenantViewSet):
    """Organisation-level webhook endpoints: every workspace's events, and the only place
    ``audit.event`` (the audit log as a stream) can be chosen."""

    organization_field = "organization"
    permission_map = dict.fromkeys(ACTIONS, roles.ORG_MANAGE_WEBHOOKS)

    def base_queryset(self):
        return selectors.endpoints_of(self.organization, None)
