"""Identity and tenancy: users, organisations, workspaces, memberships and API tokens.

Writes go through ``services`` (tenancy), ``identity`` (credentials), ``compute_targets`` and
``invitations``; nothing here changes more than its own row.
"""

from __future__ import annotations

import math

from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.contrib.auth.models import Group, PermissionsMixin
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

slug_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$",
    "Use 1-40 lowercase letters, digits and hyphens, starting and ending with a letter or digit.",
)


MAX_MIN_RUNTIME_SECONDS = 7 * 24 * 3600  # a job's max_runtime_seconds is capped at a week too
MAX_PREEMPTION_GRACE_SECONDS = 3600

# The keys a workspace's approval thresholds may name: above any, a job needs approval.
THRESHOLD_KEYS = ("gpu", "cpu", "memory_gb", "max_runtime_seconds")


def validate_approval_thresholds(value) -> None:
    """Checked by the model, so the API, the admin panel and commands refuse the same values."""
    if not isinstance(value, dict):
        raise ValidationError("must be an object of resource → limit")
    unknown = sorted(set(value) - set(THRESHOLD_KEYS))
    if unknown:
        raise ValidationError(
            f"unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(THRESHOLD_KEYS)}"
        )
    for key, limit in value.items():
        number = isinstance(limit, int | float) and not isinstance(limit, bool)
        if not number or not math.isfinite(limit) or not 0 <= limit <= 1e15:
            raise ValidationError(f"{key}: must be a number from 0 to 1e15, not {limit!r}")


def validate_image_prefixes(value) -> None:
    if not isinstance(value, list) or not all(
        isinstance(item, str) and item and len(item) <= 300 and "\0" not in item for item in value
    ):
        raise ValidationError("must be a list of non-empty image prefixes (at most 300 characters)")


class UserManager(BaseUserManager["User"]):
    use_in_migrations = True

    def create_user(self, email: str, password: str | None = None, **extra) -> User:
        if not email:
            raise ValueError("email is required")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_superuser(self, email: str, password: str | None = None, **extra) -> User:
        extra.update(is_staff=True, is_superuser=True)
        return self.create_user(email, password, **extra)


# The emails a user can turn off (notifications/emails.py sends them): the keys of
# ``User.notification_preferences``, where an absent key means on.
EMAIL_APPROVAL_REQUESTED = "job_approval_requested"
EMAIL_JOB_FAILED = "job_failed"
EMAIL_WEBHOOK_DISABLED = "webhook_disabled"
EMAIL_CATEGORIES: dict[str, str] = {
    EMAIL_APPROVAL_REQUESTED: "A job in a workspace where you approve jobs waits for approval",
    EMAIL_JOB_FAILED: "A job you submitted failed",
    EMAIL_WEBHOOK_DISABLED: "A webhook endpoint of an organisation you administer was disabled",
}


class User(AbstractBaseUser, PermissionsMixin):
    """A person. The email is the login; it is stored lower-cased."""

    email = models.EmailField(unique=True)
    full_name = models.CharField(max_length=200, blank=True)
    is_active = models.BooleanField(default=True)
    # Staff = may open the admin panel; services keep it equal to "administers some org".
    is_staff = models.BooleanField(default=False)
    date_joined = models.DateTimeField(default=timezone.now)
    notification_preferences = models.JSONField(default=dict, blank=True)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.email


class Organization(models.Model):
    slug = models.SlugField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    # Image policy: a template's image must start with one of these.
    allowed_image_prefixes = models.JSONField(
        default=list, blank=True, validators=[validate_image_prefixes]
    )
    # The most Ray nodes (head + worker replicas) one job may ask for.
    max_nodes_per_job = models.PositiveIntegerField(
        default=16, validators=[MinValueValidator(1), MaxValueValidator(1000)]
    )
    # The longest minimum runtime a job may ask for (its spec's min_runtime_seconds): a job
    # younger than its minimum is never preempted, so this bounds how long a workspace under
    # its guarantee may have to wait for borrowed capacity.
    max_min_runtime_seconds = models.PositiveIntegerField(
        default=3600, db_default=3600, validators=[MaxValueValidator(MAX_MIN_RUNTIME_SECONDS)]
    )
    # How long a preempted job's driver has between SIGTERM and the end of its cluster (time to
    # write a checkpoint). 0: it is stopped at once.
    preemption_grace_seconds = models.PositiveIntegerField(
        default=30, db_default=30, validators=[MaxValueValidator(MAX_PREEMPTION_GRACE_SECONDS)]
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.slug


class OrgRole(models.TextChoices):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"


class OrgMembership(models.Model):
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="memberships"
    )
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="org_memberships")
    role = models.CharField(max_length=16, choices=OrgRole.choices, default=OrgRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "user"], name="uniq_org_member"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.organization} ({self.role})"

    @property
    def is_admin(self) -> bool:
        return self.role in (OrgRole.OWNER, OrgRole.ADMIN)


class Invitation(models.Model):
    """An invitation of an email address into an organisation: the one way an account joins
    one. Whoever holds the one-time token accepts it (an existing account with its password),
    before ``expires_at``; only the token's hash is stored."""

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="invitations"
    )
    email = models.EmailField()
    org_role = models.CharField(max_length=16, choices=OrgRole.choices, default=OrgRole.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.email} → {self.organization}"


class ApprovalPolicy(models.TextChoices):
    AUTO = "auto"
    ALWAYS = "always"
    THRESHOLD = "threshold"


class Workspace(models.Model):
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="workspaces"
    )
    slug = models.SlugField(max_length=40, validators=[slug_validator])
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, max_length=2000)
    approval_policy = models.CharField(
        max_length=16, choices=ApprovalPolicy.choices, default=ApprovalPolicy.AUTO
    )
    # {"gpu": 1, "cpu": 16, "memory_gb": 64, "max_runtime_seconds": 3600}: above any → approval.
    approval_thresholds = models.JSONField(
        default=dict, blank=True, validators=[validate_approval_thresholds]
    )
    compute_target = models.CharField(max_length=64, default="local")
    # Jobs submitted with a spec of their own instead of a template (every rule still applies).
    adhoc_jobs = models.BooleanField(default=False)
    archived_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "slug"], name="uniq_workspace_slug"),
        ]
        # Object permissions held through django-guardian (see workspaces/roles.py).
        permissions = [
            ("manage_workspace", "Edit and archive the workspace"),
            ("manage_members", "Grant and revoke workspace roles"),
            ("manage_templates", "Create and edit job templates"),
            ("submit_job", "Submit jobs"),
            ("cancel_own_job", "Cancel one's own jobs"),
            ("cancel_any_job", "Cancel anyone's jobs"),
            ("approve_job", "Approve or reject jobs"),
            ("manage_webhooks", "Manage workspace webhook endpoints"),
        ]

    def __str__(self) -> str:
        return f"{self.organization.slug}/{self.slug}"


class WorkspaceRole(models.TextChoices):
    ADMIN = "admin"
    DEVELOPER = "developer"
    VIEWER = "viewer"


class WorkspaceMembership(models.Model):
    """A role grant. The user is also in the workspace's guardian group for that role, which is
    what permission checks read; services keep the two in step."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="workspace_memberships")
    role = models.CharField(max_length=16, choices=WorkspaceRole.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "user"], name="uniq_workspace_member"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.workspace} ({self.role})"


class WorkspaceRoleGroup(models.Model):
    """The guardian group that carries one role's permissions on one workspace."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="role_groups")
    role = models.CharField(max_length=16, choices=WorkspaceRole.choices)
    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="workspace_role")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "role"], name="uniq_workspace_role_group"),
        ]

    def __str__(self) -> str:
        return f"{self.workspace} {self.role}"


class ApiToken(models.Model):
    """A personal access token. Only the SHA-256 of the secret is stored: the secret is 256 random
    bits, so a slow password hash would add latency to every request and no security."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12)  # the first characters, to recognise a token
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    def is_usable(self, now=None) -> bool:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now


class ComputeTargetKind(models.TextChoices):
    LOCAL = "local"
    RAY = "ray"
    KUBERAY = "kuberay"


class ComputeTarget(models.Model):
    """Where an org's jobs run. A workspace names one in ``compute_target``; ``local`` (an
    ephemeral Ray cluster per attempt on the worker's host) exists implicitly in every org."""

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="compute_targets"
    )
    name = models.SlugField(max_length=64, validators=[slug_validator])
    kind = models.CharField(max_length=16, choices=ComputeTargetKind.choices)
    config = models.JSONField(default=dict, blank=True)  # without secrets
    secret_encrypted = models.TextField(blank=True)  # e.g. the ray cluster's auth token
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="uniq_compute_target"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class IdempotencyRecord(models.Model):
    """The outcome of a create request sent with an ``Idempotency-Key``: a retry with the same
    key (same user, same path, same body) gets this response again instead of a second object.
    The response is stored encrypted: it may carry a secret shown once (a webhook's)."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    path = models.CharField(max_length=500)
    fingerprint = models.CharField(max_length=64)  # SHA-256 of the canonical request body
    status_code = models.PositiveSmallIntegerField(null=True)
    response_encrypted = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key", "path"], name="uniq_idempotency_key"),
        ]

    def __str__(self) -> str:
        return f"{self.key} {self.path}"
