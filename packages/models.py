"""Code packages: zips of a working directory a developer uploaded to a workspace.

The bytes are stored once per content (``sha256``) in the ``packages`` storage; a row records
that a workspace holds that content, so a job can only use code uploaded to its own workspace.
"""

import re

from django.conf import settings
from django.db import models


class CodePackage(models.Model):
    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.PROTECT, related_name="packages"
    )
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # The last submission that referred to it: packages no job used for a while are deleted.
    last_used_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "sha256"], name="uniq_package_content")
        ]

    def __str__(self) -> str:
        return f"{self.workspace_id}:{self.sha256[:12]}"

    @property
    def uri(self) -> str:
        return f"{URI_PREFIX}{self.sha256}"


URI_PREFIX = "manta://packages/"

# A git branch, tag or commit a job may name: what ``git check-ref-format`` accepts, in a
# narrower alphabet, and never an option (a leading '-'). Checked when a job is submitted
# (jobs/spec.py) and again before the worker hands it to git (packages/sources.py).
GIT_REF = re.compile(
    r"^(?!-)(?!/)(?!.*\.\.)(?!.*//)(?!.*@\{)(?!.*\.lock$)(?!.*[/.]$)[A-Za-z0-9._/+-]+$"
)
MAX_REF = 255
GIT_REF_RULE = (
    "must be a branch, a tag or a commit sha (letters, digits and . _ / + -, at most "
    f"{MAX_REF} characters, not starting with '-' or '/', without '..', '//' or '@{{')"
)


class CodeSource(models.Model):
    """A git repository a workspace runs code from (a code configuration): jobs name it and a
    ref; the worker fetches that commit, packages it like an upload and records the commit on
    the attempt."""

    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.CASCADE, related_name="code_sources"
    )
    name = models.SlugField(max_length=63)
    url = models.CharField(max_length=500)
    default_ref = models.CharField(max_length=255, default="main")
    # An SSH private key with read access to the repository, encrypted at rest, never shown.
    deploy_key_encrypted = models.TextField(blank=True)
    # The server's host keys (known_hosts lines) for ssh:// URLs; empty accepts the key it shows.
    known_hosts = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="uniq_code_source_name")
        ]

    def __str__(self) -> str:
        return f"{self.workspace_id}:{self.name}"

    @property
    def has_deploy_key(self) -> bool:
        return bool(self.deploy_key_encrypted)
