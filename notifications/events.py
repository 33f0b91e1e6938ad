"""The registry of event types: what each means and the shape of its ``data``.

One table serves three readers: the API validates ``event_types`` against it, the OpenAPI
schema documents one component per event type from it (the ``payload`` of a delivery), and the
README's list is this list. A message's body follows the Standard Webhooks format::

    {"type": "job.succeeded", "timestamp": "2026-12-02T10:00:00.123456Z",
     "data": {"id": "<event id>", "organization": "acme", "workspace": "ml", ...payload}}
"""

from __future__ import annotations

import dataclasses

from rest_framework import serializers

AUDIT_EVENT = "audit.event"
PING = "webhook.ping"
ORG_ONLY = frozenset({AUDIT_EVENT})  # may only be chosen on an org-level endpoint


class EventData(serializers.Serializer):
    """Fields every event's ``data`` carries."""

    id = serializers.CharField(help_text="The event's id: stable, unique")
    organization = serializers.CharField(help_text="The organisation's slug")
    workspace = serializers.CharField(
        allow_null=True, help_text="The workspace's slug; null for org-level events"
    )


class JobSummary(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField()
    workspace = serializers.CharField()
    organization = serializers.CharField()
    submitted_by = serializers.EmailField()
    requested = serializers.DictField(child=serializers.FloatField())
    priority = serializers.IntegerField()
    failure_reason = serializers.CharField()
    message = serializers.CharField()


class JobEventData(EventData):
    job = JobSummary()
    reason = serializers.CharField()
    actor = serializers.CharField(help_text="Who made the change (an email or system:…)")


class QuotaThresholdData(EventData):
    threshold_percent = serializers.IntegerField()
    gpu_hours_used = serializers.FloatField()
    gpu_hours_per_month = serializers.FloatField()
    period = serializers.DateField()
    gpu_flavor = serializers.CharField(
        required=False,
        help_text="Present when the budget is one GPU flavor's (the workspace's gpu_flavors)",
    )


class MemberSummary(serializers.Serializer):
    email = serializers.EmailField()
    role = serializers.CharField()


class MemberEventData(EventData):
    member = MemberSummary()
    actor = serializers.CharField()


class WorkspaceCreatedData(EventData):
    name = serializers.CharField()
    description = serializers.CharField()
    actor = serializers.CharField()


class TemplateSummary(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.IntegerField()


class TemplateVersionData(EventData):
    template = TemplateSummary()


class AuditActor(serializers.Serializer):
    type = serializers.ChoiceField(choices=["user", "token", "system"])
    label = serializers.CharField()


class AuditTarget(serializers.Serializer):
    type = serializers.CharField()
    id = serializers.CharField()
    repr = serializers.CharField()


class AuditEventData(EventData):
    seq = serializers.IntegerField(help_text="Position in the organisation's audit hash chain")
    action = serializers.CharField()
    actor = AuditActor()
    target = AuditTarget()
    changes = serializers.DictField(help_text='{"field": [old, new]}')
    metadata = serializers.DictField()
    request_id = serializers.CharField()
    ip = serializers.IPAddressField(allow_null=True)
    hash = serializers.CharField()


class PingData(EventData):
    webhook = serializers.IntegerField(help_text="The endpoint's id")
    message = serializers.CharField()


@dataclasses.dataclass(frozen=True)
class EventType:
    name: str
    description: str
    data: type[serializers.Serializer]


def _job(name: str, description: str) -> EventType:
    return EventType(name, description, JobEventData)


EVENT_TYPES: dict[str, EventType] = {
    e.name: e
    for e in [
        _job("job.submitted", "A job was submitted"),
        _job("job.approval_requested", "A submitted job waits for an approver"),
        _job("job.approved", "A job was approved"),
        _job("job.rejected", "A job was rejected"),
        _job("job.queued", "A job entered the admission queue"),
        _job("job.launching", "A job was admitted under quota; its cluster is starting"),
        _job("job.running", "A job's entrypoint is running"),
        _job("job.succeeded", "A job finished successfully"),
        _job("job.failed", "A job failed"),
        _job("job.cancelled", "A job was cancelled"),
        _job(
            "job.preempting",
            "A running job was chosen for preemption: its driver got SIGTERM and has the "
            "organisation's grace period before its cluster is torn down",
        ),
        _job("job.preempted", "A running job was preempted and queued again"),
        _job("job.node_restarted", "A dead worker node of a job's cluster was started again"),
        EventType(
            "quota.threshold_reached",
            "A workspace used 80 % or 100 % of its monthly GPU-hour budget (in all, or of one "
            "GPU flavor)",
            QuotaThresholdData,
        ),
        EventType("member.added", "A user was granted a role in a workspace", MemberEventData),
        EventType("member.removed", "A user's workspace role was revoked", MemberEventData),
        EventType("workspace.created", "A workspace was created", WorkspaceCreatedData),
        EventType(
            "template.version_created",
            "A job template was created or got a new version",
            TemplateVersionData,
        ),
        EventType(
            AUDIT_EVENT,
            "Every audit event of the organisation (org-level endpoints only)",
            AuditEventData,
        ),
        EventType(PING, "A test message sent on request", PingData),
    ]
}

# Types an endpoint can subscribe to: all of them. A ping is sent on request whatever the
# subscription, but naming it is not an error (receivers list what they handle).
SUBSCRIBABLE = tuple(EVENT_TYPES)


def _component_name(event_type: str) -> str:
    words = event_type.replace(".", "_").split("_")
    return "".join(word.capitalize() for word in words) + "Event"


def _envelope(event_type: EventType) -> type[serializers.Serializer]:
    """The body of one event type as a serializer (documentation only: bodies are built by
    ``delivery.message_body``)."""
    fields = {
        "type": serializers.CharField(help_text=f'Always "{event_type.name}"'),
        "timestamp": serializers.DateTimeField(help_text="When the event happened"),
        "data": event_type.data(),
        "__doc__": event_type.description,
    }
    return type(_component_name(event_type.name), (serializers.Serializer,), fields)


ENVELOPES: dict[str, type[serializers.Serializer]] = {
    name: _envelope(event_type) for name, event_type in EVENT_TYPES.items()
}
