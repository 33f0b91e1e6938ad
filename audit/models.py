"""Append-only, hash-chained audit events.

Each organisation has its own chain (``chain = "org:<id>"``; user-level events such as token
issuance that belong to no org go to ``"global"``). ``hash = sha256(prev_hash + canonical form)``
over every stored field, so changing, removing or reordering a stored row breaks the chain at that
row; ``hash_version`` names the canonical form (audit/chain.py). On PostgreSQL a trigger
(migration 0003) refuses UPDATE, DELETE and TRUNCATE outright.
"""

from django.conf import settings
from django.db import models

GENESIS_HASH = "0" * 64

# The canonical forms an event's hash is computed over (audit/chain.py): 1 = json.dumps of the
# values before storage (rows written before migration 0004), 2 = RFC 8785 of the stored values.
HASH_V1_JSON_DUMPS = 1
HASH_V2_RFC8785 = 2
HASH_VERSION = HASH_V2_RFC8785  # what new events are written with


class AuditChainHead(models.Model):
    """The last link of one chain. Appends lock this row, so a chain is written one event at a
    time even with many writers, and readers never see a gap in ``seq``."""

    chain = models.CharField(max_length=40, primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64, default=GENESIS_HASH)

    def __str__(self) -> str:
        return f"{self.chain}@{self.seq}"


class AuditEvent(models.Model):
    chain = models.CharField(max_length=40)
    seq = models.BigIntegerField()
    occurred_at = models.DateTimeField()
    organization = models.ForeignKey(
        "workspaces.Organization", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    workspace = models.ForeignKey(
        "workspaces.Workspace", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_type = models.CharField(max_length=16)  # user | token | system
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_token_id = models.BigIntegerField(null=True, blank=True)
    actor_label = models.CharField(max_length=254)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    target_repr = models.CharField(max_length=300)
    changes = models.JSONField(default=dict, blank=True)  # {"field": [old, new]}
    metadata = models.JSONField(default=dict, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=512, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # The database default labels rows written without a version (before migration 0004, or by a
    # writer that predates it) as version 1, which is how such writers hash.
    hash_version = models.PositiveSmallIntegerField(
        default=HASH_VERSION, db_default=HASH_V1_JSON_DUMPS
    )

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="uniq_audit_chain_seq"),
        ]
        indexes = [
            models.Index(fields=["organization", "occurred_at"], name="audit_org_time_idx"),
            models.Index(fields=["organization", "action"], name="audit_org_action_idx"),
            models.Index(fields=["target_type", "target_id"], name="audit_target_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.target_type}:{self.target_id} by {self.actor_label}"


class AuditCheckpoint(models.Model):
    """A signed statement that a chain was ``count`` events long, ending with event
    ``last_event_id`` of hash ``head_hash`` (audit/signing.py). Written only after the chain
    verified up to there; append-only like the events (migration 0006)."""

    chain = models.CharField(max_length=40)
    count = models.BigIntegerField()  # the seq of its last event: a chain's seq counts from 1
    last_event_id = models.BigIntegerField()
    head_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    signature = models.CharField(max_length=64)  # HMAC-SHA256, hex

    class Meta:
        ordering = ["chain", "count"]
        constraints = [
            models.UniqueConstraint(fields=["chain", "count"], name="uniq_audit_checkpoint"),
        ]

    def __str__(self) -> str:
        return f"{self.chain}@{self.count}"
