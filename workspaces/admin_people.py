"""People in the admin panel: accounts, invitations and API tokens.

An account and its tokens belong to a person, not to an organisation, and a person may belong to
several. An org admin sees the accounts of their organisations' members (with only the
memberships of organisations they administer) and those accounts' tokens, never a token's secret
or hash. Revoking a token cuts its owner off everywhere, so an org admin revokes only the tokens
of people whose every organisation they administer. Accounts join by invitation, as in the API.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.utils import timezone

from . import identity, invitations
from .admin import OrgScopedAdmin, ReadOnlyInline, administered_org_ids
from .models import ApiToken, Invitation, OrgMembership, User


def _members_of(org_ids) -> QuerySet:
    return OrgMembership.objects.filter(organization_id__in=org_ids).values("user_id")


class MemberScopedAdmin(OrgScopedAdmin):
    """Rows of a person: visible when the person is a member of an organisation the user
    administers. ``user_field`` is the lookup from the model to the person's id."""

    user_field = "pk"

    def get_queryset(self, request) -> QuerySet:
        qs = admin.ModelAdmin.get_queryset(self, request)
        if request.user.is_superuser:
            return qs
        members = _members_of(administered_org_ids(request.user))
        return qs.filter(**{f"{self.user_field}__in": members})

    def person_of(self, obj) -> int:
        return obj.pk

    def _allowed(self, request, obj=None) -> bool:
        if not super()._allowed(request):  # staff, and administers some organisation
            return False
        if obj is None or request.user.is_superuser:
            return True
        members = _members_of(administered_org_ids(request.user))
        return members.filter(user_id=self.person_of(obj)).exists()

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class OrgMembershipInline(ReadOnlyInline):
    model = OrgMembership
    fields = ["organization", "role", "created_at"]

    def get_queryset(self, request):
        qs = super().get_queryset(request).select_related("organization")
        if request.user.is_superuser:
            return qs
        return qs.filter(organization_id__in=administered_org_ids(request.user))


@admin.register(User)
class UserAdmin(MemberScopedAdmin):
    """Read-only: a person manages their own account; an org admin invites, changes roles in
    workspaces through the API, and revokes tokens here."""

    list_display = ["email", "full_name", "is_active", "last_login", "date_joined"]
    list_filter = ["is_active"]
    search_fields = ["email", "full_name"]
    fields = ["email", "full_name", "is_active", "last_login", "date_joined"]
    inlines = [OrgMembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(MemberScopedAdmin):
    user_field = "user_id"
    list_display = ["prefix", "name", "user", "created_at", "expires_at", "last_used_at",
                    "revoked_at"]  # fmt: skip
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["user__email", "name", "prefix"]
    list_select_related = ["user"]
    fields = ["prefix", "name", "user", "created_at", "expires_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def person_of(self, obj) -> int:
        return obj.user_id

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        mine = set(administered_org_ids(request.user))
        tokens = list(queryset.select_related("user"))
        memberships: dict[int, set[int]] = {}
        for user_id, org_id in OrgMembership.objects.filter(
            user_id__in={t.user_id for t in tokens}
        ).values_list("user_id", "organization_id"):
            memberships.setdefault(user_id, set()).add(org_id)
        done = 0
        for token in tokens:
            if not request.user.is_superuser and memberships.get(token.user_id, set()) - mine:
                self.message_user(
                    request,
                    f"token {token.prefix}… of {token.user}: not revoked, its owner also belongs "
                    "to organisations you do not administer (they revoke it themselves)",
                    level=messages.ERROR,
                )
                continue
            if token.revoked_at is None and self.run_service(
                request,
                lambda actor, t=token: identity.token_revoke(actor=actor, token=t),
                label=f"token {token.prefix}…",
            ):
                done += 1
        if done:
            self.message_user(request, f"Revoked {done} token(s).")


class InvitationForm(forms.ModelForm):
    class Meta:
        model = Invitation
        fields = ["organization", "email", "org_role"]


@admin.register(Invitation)
class InvitationAdmin(OrgScopedAdmin):
    """Invite (the token goes by email to the invitee only) and revoke; both audited."""

    form = InvitationForm
    list_display = ["email", "organization", "org_role", "status", "invited_by", "created_at",
                    "expires_at"]  # fmt: skip
    list_filter = ["org_role"]
    search_fields = ["email"]
    list_select_related = ["organization", "invited_by"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["organization", "email", "org_role"]
        return ["organization", "email", "org_role", "status", "invited_by", "created_at",
                "expires_at", "accepted_at", "revoked_at"]  # fmt: skip

    def get_readonly_fields(self, request, obj=None):
        return self.get_fields(request, obj) if obj else []

    def has_change_permission(self, request, obj=None):
        return False  # an invitation is revoked and sent again, never edited

    @admin.display(description="status")
    def status(self, obj: Invitation) -> str:
        if obj.accepted_at:
            return "accepted"
        if obj.revoked_at:
            return "revoked"
        return "expired" if obj.expires_at and obj.expires_at <= timezone.now() else "pending"

    def save_model(self, request, obj, form, change):
        def invite(actor):
            invitation, _token = invitations.invitation_create(
                actor=actor,
                organization=obj.organization,
                email=obj.email,
                org_role=obj.org_role,
            )
            obj.pk, obj.email = invitation.pk, invitation.email

        self.save_through(request, invite)

    def response_add(self, request, obj, post_url_continue=None):
        self.message_user(request, f"Invited {obj.email}: the invitation was sent by email.")
        return super().response_add(request, obj, post_url_continue)

    @admin.action(description="Revoke selected invitations")
    def revoke(self, request, queryset):
        done = 0
        for invitation in queryset.filter(accepted_at=None, revoked_at=None):
            if self.run_service(
                request,
                lambda actor, i=invitation: invitations.invitation_revoke(
                    actor=actor, invitation=i
                ),
                label=f"invitation of {invitation.email}",
            ):
                done += 1
        self.message_user(request, f"Revoked {done} pending invitation(s).")
