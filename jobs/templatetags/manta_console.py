"""The console's links on the admin index: each organisation the user administers, with how many
of its jobs wait for approval (one query)."""

from django import template
from django.db.models import Count, Q

from workspaces.admin import administered_org_ids
from workspaces.models import Organization

from ..models import JobState

register = template.Library()


@register.simple_tag(takes_context=True)
def console_organizations(context):
    user = context["request"].user
    if not (user.is_active and user.is_staff):
        return []
    orgs = Organization.objects.order_by("slug")
    if not user.is_superuser:
        orgs = orgs.filter(pk__in=administered_org_ids(user))
    return list(
        orgs.annotate(
            pending_approval=Count(
                "workspaces__jobs",
                filter=Q(workspaces__jobs__state=JobState.PENDING_APPROVAL),
            )
        )
    )
