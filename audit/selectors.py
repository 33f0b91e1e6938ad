from django.db.models import QuerySet

from .models import AuditEvent


def audit_events_for_org(*, organization) -> QuerySet[AuditEvent]:
    return (
        AuditEvent.objects.filter(organization=organization)
        .select_related("workspace", "actor")
        .order_by("-id")
    )
