"""Email notifications: who hears about what, and the tasks that send them.

Three rules: the workspace's approvers when a job waits for approval, the submitter when a job
fails, the organisation's admins when a webhook endpoint is disabled. Each is a category a user
can turn off (``notification_preferences`` on ``me/``, kept on the user: ``workspaces.models``;
absent means on). Emails are sent by a task after the commit that decided them, through Django's
email backend (console unless configured).

The two email tasks live here rather than in ``tasks.py``: the dispatcher and the delivery code,
which ``tasks.py`` runs, schedule them, so here they sit below both.
"""

from __future__ import annotations

from celery import shared_task
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import Q

from outbox.models import DomainEvent
from workspaces.models import (
    EMAIL_APPROVAL_REQUESTED,
    EMAIL_JOB_FAILED,
    EMAIL_WEBHOOK_DISABLED,
    OrgMembership,
    OrgRole,
    User,
    WorkspaceMembership,
)
from workspaces.roles import WORKSPACE_ROLE_PERMISSIONS, WS_APPROVE_JOB

from .models import WebhookEndpoint

# Domain event type → email category.
RULES = {"job.approval_requested": EMAIL_APPROVAL_REQUESTED, "job.failed": EMAIL_JOB_FAILED}

ADMIN_ROLES = (OrgRole.OWNER, OrgRole.ADMIN)


def wants(user: User, category: str) -> bool:
    return user.is_active and bool((user.notification_preferences or {}).get(category, True))


def schedule_for_event(event_id) -> None:
    transaction.on_commit(lambda: email_event.delay(str(event_id)), robust=True)


def schedule_endpoint_disabled(endpoint_id: int) -> None:
    transaction.on_commit(lambda: email_endpoint_disabled.delay(endpoint_id), robust=True)


@shared_task(name="manta.notifications.email_event")
def email_event(event_id: str) -> int:
    return event_email_send(event_id)


@shared_task(name="manta.notifications.email_endpoint_disabled")
def email_endpoint_disabled(endpoint_id: int) -> int:
    return endpoint_disabled_email_send(endpoint_id)


def approvers(workspace_id: int, organization_id: int) -> list[User]:
    roles = [r for r, perms in WORKSPACE_ROLE_PERMISSIONS.items() if WS_APPROVE_JOB in perms]
    org_admins = OrgMembership.objects.filter(
        organization_id=organization_id, role__in=ADMIN_ROLES
    ).values("user_id")
    ws_approvers = WorkspaceMembership.objects.filter(
        workspace_id=workspace_id, role__in=roles
    ).values("user_id")
    return list(User.objects.filter(Q(pk__in=org_admins) | Q(pk__in=ws_approvers)).order_by("id"))


def org_admins(organization_id: int) -> list[User]:
    return list(
        User.objects.filter(
            org_memberships__organization_id=organization_id,
            org_memberships__role__in=ADMIN_ROLES,
        ).order_by("id")
    )


def _send(category: str, users: list[User], subject: str, body: str) -> int:
    messages = [
        EmailMessage(subject=subject, body=body, to=[user.email])
        for user in users
        if wants(user, category)
    ]
    if not messages:
        return 0
    return get_connection().send_messages(messages) or 0


def event_email_send(event_id: str) -> int:
    """Send the emails a domain event calls for; returns how many were sent."""
    event = (
        DomainEvent.objects.select_related("organization", "workspace").filter(pk=event_id).first()
    )
    if event is None or event.type not in RULES:
        return 0
    job = event.payload.get("job", {})
    where = f"{event.organization.slug}/{event.workspace.slug if event.workspace else '-'}"
    title = f"job {job.get('id')} {job.get('name', '')}".strip()
    if event.type == "job.approval_requested":
        users = [
            u
            for u in approvers(event.workspace_id, event.organization_id)
            if u.email != job.get("submitted_by")  # a submitter never approves their own job
        ]
        body = (
            f"{job.get('submitted_by')} submitted {title} in {where}; it waits for approval.\n"
            f"Requested resources: {job.get('requested')}\n"
            f"Approve or reject it: POST …/workspaces/{event.workspace.slug}/jobs/"
            f"{job.get('id')}/approve/ or …/reject/\n"
        )
        return _send(EMAIL_APPROVAL_REQUESTED, users, f"[Manta] Approval requested: {title}", body)
    users = list(User.objects.filter(email__iexact=job.get("submitted_by", "")))
    body = (
        f"Your {title} in {where} failed.\n"
        f"Reason: {job.get('failure_reason') or '-'}\n{job.get('message', '')}\n"
    )
    return _send(EMAIL_JOB_FAILED, users, f"[Manta] Job failed: {title}", body)


def endpoint_disabled_email_send(endpoint_id: int) -> int:
    endpoint = (
        WebhookEndpoint.objects.select_related("organization", "workspace")
        .filter(pk=endpoint_id)
        .first()
    )
    if endpoint is None or endpoint.enabled:
        return 0
    scope = f"workspace {endpoint.workspace.slug}" if endpoint.workspace else "the organisation"
    body = (
        f"The webhook endpoint {endpoint.pk} of {scope} in {endpoint.organization.slug} "
        f"({endpoint.url}) was disabled: {endpoint.disabled_reason}.\n"
        "Deliveries are kept; fix the receiver and enable the endpoint again (PATCH enabled=true)"
        " to resume them.\n"
    )
    subject = f"[Manta] Webhook endpoint disabled: {endpoint.url[:80]}"
    return _send(EMAIL_WEBHOOK_DISABLED, org_admins(endpoint.organization_id), subject, body)
