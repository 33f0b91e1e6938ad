"""Invitations: how an account joins an organisation.

An organisation owns its memberships, and an account may belong to several. So an org admin
never adds an existing account directly: they invite an email address, and whoever holds the
one-time token accepts — proving the account with its password when one exists, choosing a
password when none does. Inviting answers the same whatever the address, so it tells nobody
which emails have accounts.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import services as audit
from audit.context import Actor
from config.errors import Forbidden, InvalidCredentials, InvalidInput

from .identity import require_valid_password, sync_staff, token_hash
from .models import Invitation, Organization, OrgMembership, OrgRole, User
from .services import _is_owner

TOKEN_PREFIX = "inv_"
# The same refusal for an unknown, used, revoked or expired token.
NOT_VALID = "this invitation is not valid: unknown, already used, revoked or expired"


@transaction.atomic
def invitation_create(
    *, actor: Actor, organization: Organization, email: str, org_role: str = OrgRole.MEMBER
) -> tuple[Invitation, str]:
    """Invite ``email``; returns the invitation and its token (shown once, and mailed). A
    pending invitation of the same address to this organisation is replaced."""
    if org_role not in OrgRole.values:
        raise InvalidInput.on("org_role", f"must be one of {', '.join(OrgRole.values)}")
    if org_role == OrgRole.OWNER and not _is_owner(actor, organization):
        raise InvalidInput.on("org_role", "only an owner can invite another owner")
    email = User.objects.normalize_email(email).lower()
    now = timezone.now()
    Invitation.objects.filter(
        organization=organization, email=email, accepted_at=None, revoked_at=None
    ).update(revoked_at=now)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        organization=organization,
        email=email,
        org_role=org_role,
        token_hash=token_hash(token),
        invited_by=actor.user,
        expires_at=now + dt.timedelta(days=settings.MANTA_INVITATION_DAYS),
    )
    audit.record(
        actor=actor,
        action="invitation.create",
        target=invitation,
        target_repr=f"invitation of {email}",
        organization=organization,
        changes={"email": [None, email], "org_role": [None, org_role]},
    )
    transaction.on_commit(lambda: _mail(invitation, token), robust=True)
    return invitation, token


def _mail(invitation: Invitation, token: str) -> None:
    org = invitation.organization
    body = (
        f"You are invited to the organisation {org.name} ({org.slug}) on Manta as "
        f"{invitation.org_role}.\n\nAccept before {invitation.expires_at:%Y-%m-%d %H:%M} UTC:\n"
        f'POST /api/v1/invitations/accept/ {{"token": "{token}", "password": …}}\n'
    )
    EmailMessage(f"Invitation to {org.name} on Manta", body, to=[invitation.email]).send()


@transaction.atomic
def invitation_revoke(*, actor: Actor, invitation: Invitation) -> None:
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if invitation.accepted_at or invitation.revoked_at:
        return
    invitation.revoked_at = timezone.now()
    invitation.save(update_fields=["revoked_at"])
    audit.record(
        actor=actor,
        action="invitation.revoke",
        target=invitation,
        target_repr=f"invitation of {invitation.email}",
        organization=invitation.organization,
    )


@transaction.atomic
def invitation_accept(
    *, token: Any, password: str = "", full_name: str = "", user: User | None = None
) -> OrgMembership:
    """Join the invitation's organisation: as ``user`` (signed in), as the existing account of
    the invited address (its ``password``), or as a new account with ``password``."""
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX) or len(token) > 100:
        raise InvalidInput.on("token", NOT_VALID)
    invitation = (
        Invitation.objects.select_for_update()
        .select_related("organization")
        .filter(token_hash=token_hash(token), accepted_at=None, revoked_at=None)
        .first()
    )
    if invitation is None or invitation.expires_at <= timezone.now():
        raise InvalidInput.on("token", NOT_VALID)
    account = User.objects.filter(email__iexact=invitation.email).first()
    if user is not None:
        if account is None or user.pk != account.pk:
            raise Forbidden(
                "this invitation is for another address", errors={"token": ["not yours"]}
            )
    elif account is not None:
        if not account.is_active or not account.check_password(password or ""):
            raise InvalidCredentials(
                "sign in as the invited account: its password is wrong",
                errors={"password": ["wrong password for the invited account"]},
            )
    else:
        require_valid_password(password, User(email=invitation.email, full_name=full_name))
        account = User.objects.create_user(invitation.email, password, full_name=full_name)
    account = user or account
    try:
        with transaction.atomic():
            membership = OrgMembership.objects.create(
                organization=invitation.organization, user=account, role=invitation.org_role
            )
    except IntegrityError:  # a member already: the invitation is used up all the same
        membership = OrgMembership.objects.get(organization=invitation.organization, user=account)
    sync_staff(account)
    invitation.accepted_at = timezone.now()
    invitation.save(update_fields=["accepted_at"])
    audit.record(
        actor=Actor.for_user(account),
        action="invitation.accept",
        target=invitation,
        target_repr=f"invitation of {invitation.email}",
        organization=invitation.organization,
        changes={"org_role": [None, membership.role]},
    )
    return membership
