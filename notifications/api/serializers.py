from drf_spectacular.utils import (
    OpenApiExample,
    PolymorphicProxySerializer,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers

from config.strict import StrictSerializer
from notifications import delivery as delivery_service
from notifications.events import ENVELOPES, SUBSCRIBABLE
from notifications.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from notifications.services import MAX_GRACE_SECONDS

EVENT_TYPES_HELP = (
    'Event types to receive, or ["*"] for every type except audit.event (which only an '
    "organisation-level endpoint can choose, and must name). Known types: "
    + ", ".join(SUBSCRIBABLE)
)

ENDPOINT_EXAMPLE = {
    "id": 7,
    "url": "https://hooks.acme.example/manta",
    "description": "ticketing",
    "event_types": ["job.failed", "job.succeeded"],
    "enabled": True,
    "workspace": "ml",
    "disabled_reason": "",
    "disabled_at": None,
    "failing_since": None,
    "created_by": "admin@acme.test",
    "created_at": "2026-12-02T10:00:00Z",
    "updated_at": "2026-12-02T10:00:00Z",
}
SECRET_EXAMPLE = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw6vTBNi8YO6Y="


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "Failures and successes to a ticketing system",
            value={
                "url": "https://hooks.acme.example/manta",
                "event_types": ["job.failed", "job.succeeded"],
                "description": "ticketing",
            },
            request_only=True,
        )
    ]
)
class WebhookCreateInput(StrictSerializer):
    url = serializers.URLField(max_length=2000, help_text="https:// URL that receives the POSTs")
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=64),
        default=["*"],
        max_length=len(SUBSCRIBABLE) + 1,
        help_text=EVENT_TYPES_HELP,
    )
    description = serializers.CharField(
        max_length=500, required=False, default="", allow_blank=True
    )
    enabled = serializers.BooleanField(default=True)


@extend_schema_serializer(
    examples=[OpenApiExample("Pause", value={"enabled": False}, request_only=True)]
)
class WebhookUpdateInput(StrictSerializer):
    url = serializers.URLField(max_length=2000, required=False)
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=64),
        required=False,
        max_length=len(SUBSCRIBABLE) + 1,
        help_text=EVENT_TYPES_HELP,
    )
    description = serializers.CharField(max_length=500, required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False, help_text="true re-enables a disabled one")


@extend_schema_serializer(
    examples=[OpenApiExample("Endpoint", value=ENDPOINT_EXAMPLE, response_only=True)]
)
class WebhookOutput(serializers.ModelSerializer):
    workspace = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    created_by = serializers.SlugRelatedField(slug_field="email", read_only=True, allow_null=True)

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "description", "event_types", "enabled", "workspace",
                  "disabled_reason", "disabled_at", "failing_since", "created_by", "created_at",
                  "updated_at"]  # fmt: skip


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "Created",
            value={**ENDPOINT_EXAMPLE, "secret": SECRET_EXAMPLE},
            response_only=True,
        )
    ]
)
class WebhookCreatedOutput(WebhookOutput):
    secret = serializers.CharField(
        help_text="The signing secret (whsec_…). Shown once; store it now."
    )

    class Meta(WebhookOutput.Meta):
        fields = [*WebhookOutput.Meta.fields, "secret"]


@extend_schema_serializer(
    examples=[OpenApiExample("One hour", value={"grace_period_seconds": 3600}, request_only=True)]
)
class RotateSecretInput(StrictSerializer):
    grace_period_seconds = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_GRACE_SECONDS,
        help_text="How long the current secret keeps signing too (default: a day)",
    )


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "Rotated",
            value={"secret": SECRET_EXAMPLE, "previous_secrets_expire_at": "2026-12-03T10:00:00Z"},
            response_only=True,
        )
    ]
)
class RotateSecretOutput(serializers.Serializer):
    secret = serializers.CharField(help_text="The new secret. Shown once; store it now.")
    previous_secrets_expire_at = serializers.DateTimeField()


class WebhookAttemptOutput(serializers.ModelSerializer):
    class Meta:
        model = WebhookAttempt
        fields = ["id", "started_at", "duration_ms", "status_code", "response_excerpt", "error"]


EVENT_BODY = PolymorphicProxySerializer(
    component_name="WebhookEventBody",
    serializers=ENVELOPES,
    resource_type_field_name="type",
)

DELIVERY_EXAMPLE = {
    "id": 41,
    "webhook_id": "msg_5f0c8a2e9b8d4f7e8a1c2b3d4e5f6a7b",
    "event_type": "job.succeeded",
    "occurred_at": "2026-12-02T10:05:00Z",
    "state": "succeeded",
    "attempt_count": 2,
    "next_attempt_at": None,
    "last_status_code": 200,
    "last_error": "",
    "delivered_at": "2026-12-02T10:05:06Z",
    "payload": {
        "type": "job.succeeded",
        "timestamp": "2026-12-02T10:05:00Z",
        "data": {"id": "5f0c8a2e-…", "organization": "acme", "workspace": "ml", "job": {}},
    },
    "attempts": [
        {"id": 90, "started_at": "2026-12-02T10:05:00Z", "duration_ms": 31, "status_code": 500,
         "response_excerpt": "oops", "error": ""},
        {"id": 91, "started_at": "2026-12-02T10:05:06Z", "duration_ms": 12, "status_code": 200,
         "response_excerpt": "ok", "error": ""},
    ],
}  # fmt: skip


@extend_schema_serializer(
    examples=[OpenApiExample("Delivered on the second attempt", value=DELIVERY_EXAMPLE)]
)
class WebhookDeliveryOutput(serializers.ModelSerializer):
    webhook_id = serializers.CharField(
        source="message_id", help_text="The webhook-id header: the same on every attempt"
    )
    payload = serializers.SerializerMethodField(help_text="The JSON body that is POSTed")
    attempts = WebhookAttemptOutput(many=True, read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = ["id", "webhook_id", "event_type", "occurred_at", "state", "attempt_count",
                  "next_attempt_at", "last_status_code", "last_error", "delivered_at", "payload",
                  "attempts"]  # fmt: skip

    @extend_schema_field(EVENT_BODY)
    def get_payload(self, delivery: WebhookDelivery) -> dict:
        return delivery_service.message_body(delivery)
