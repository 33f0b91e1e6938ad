"""Accounts' own settings and credentials: passwords, the staff flag, email preferences and API
tokens. Each write records its audit event in the same transaction."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.utils import timezone

from audit import services as audit
from audit.context import Actor
from config.errors import InvalidInput
from config.prepared import PreparedRead

from . import selectors
from .models import EMAIL_CATEGORIES, ApiToken, OrgRole, User

TOKEN_PREFIX = "mnt_"


# --- users -------------------------------------------------------------------------------------


def require_valid_password(password: str, user: User | None = None) -> None:
    """Refuse a password the configured validators refuse, as a 400 naming ``password``."""
    try:
        validate_password(password, user)
    except DjangoValidationError as exc:
        message = "password: " + " ".join(exc.messages)
        raise InvalidInput(message, errors={"password": exc.messages}) from exc


def sync_staff(user: User) -> None:
    """Staff (admin panel access) follows "administers at least one org"; superusers keep it."""
    administers = user.org_memberships.filter(role__in=[OrgRole.OWNER, OrgRole.ADMIN]).exists()
    is_staff = administers or user.is_superuser
    if user.is_staff != is_staff:
        user.is_staff = is_staff
        user.save(update_fields=["is_staff"])


@transaction.atomic
def notification_preferences_update(
    *, actor: Actor, user: User, preferences: dict[str, bool]
) -> dict[str, bool]:
    """Turn email categories on or off for ``user``; returns every category's setting."""
    unknown = [key for key in preferences if key not in EMAIL_CATEGORIES]
    if unknown:
        raise InvalidInput.on(
            f"notification_preferences.{unknown[0]}",
            f"unknown category; choose from {', '.join(EMAIL_CATEGORIES)}",
        )
    user = User.objects.select_for_update().get(pk=user.pk)
    current = selectors.notification_preferences_of(user)
    merged = {**current, **{key: bool(value) for key, value in preferences.items()}}
    changes = {k: [current[k], merged[k]] for k in merged if current[k] != merged[k]}
    if changes:
        user.notification_preferences = merged
        user.save(update_fields=["notification_preferences"])
        audit.record(
            actor=actor,
            action="user.notification_preferences",
            target=user,
            changes={"notification_preferences": [current, merged]},
        )
    return merged


# --- API tokens --------------------------------------------------------------------------------


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def token_create(
    *, actor: Actor, user: User, name: str = "", expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """Issue a token; the secret is returned once and never stored."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = timezone.now() + dt.timedelta(days=expires_in_days) if expires_in_days else None
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=secret[: len(TOKEN_PREFIX) + 6],
        key_hash=token_hash(secret),
        expires_at=expires_at,
    )
    audit.record(
        actor=actor,
        action="token.create",
        target=token,
        target_repr=f"{token.prefix}… {name}".strip(),
        metadata={"expires_at": expires_at},
    )
    return token, secret


@transaction.atomic
def token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    token = ApiToken.objects.select_for_update().get(pk=token.pk)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit.record(
            actor=actor,
            action="token.revoke",
            target=token,
            target_repr=f"{token.prefix}… {token.name}".strip(),
        )
    return token


LAST_USED_RESOLUTION = dt.timedelta(seconds=60)

# Every authenticated request reads its token: compiled once per connection (config/prepared.py).
_TOKEN_BY_HASH = PreparedRead(
    lambda key_hash: (
        ApiToken.objects.select_related("user").filter(key_hash=key_hash).order_by("pk")[:1]
    ),
    str,
)


def token_authenticate(secret: str) -> ApiToken | None:
    """The usable token for ``secret``, or None. Marks it used (at most once a minute, so a busy
    client does not turn every read into a write)."""
    if not secret.startswith(TOKEN_PREFIX):
        return None
    token = _TOKEN_BY_HASH.first(token_hash(secret))
    now = timezone.now()
    if token is None or not token.is_usable(now) or not token.user.is_active:
        return None
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
