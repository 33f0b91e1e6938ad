"""Signed checkpoints of the audit chains (as CloudTrail's digest files): HMAC-SHA256 over a
chain's length, last event and head hash, with a key the database does not hold.

Someone who can write to the database can rewrite a chain and recompute every hash after their
edit, so the chain alone then verifies; a checkpoint signed before the edit no longer matches
the rewritten event, and they cannot sign a new one without the key. The key is
``MANTA_AUDIT_CHECKPOINT_KEY``, or one derived from ``SECRET_KEY`` when that is empty: a
different key makes every earlier checkpoint fail to verify.
"""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

from .models import AuditCheckpoint


def _key() -> bytes:
    configured = settings.MANTA_AUDIT_CHECKPOINT_KEY
    if configured:
        return configured.encode()
    return hmac.new(settings.SECRET_KEY.encode(), b"manta.audit.checkpoint", "sha256").digest()


def _message(checkpoint: AuditCheckpoint) -> bytes:
    fields = (
        "manta.audit.checkpoint.v1",
        checkpoint.chain,
        str(checkpoint.count),
        str(checkpoint.last_event_id),
        checkpoint.head_hash,
        checkpoint.created_at.isoformat(timespec="microseconds"),
    )
    return "\n".join(fields).encode()


def checkpoint_signature(checkpoint: AuditCheckpoint) -> str:
    return hmac.new(_key(), _message(checkpoint), hashlib.sha256).hexdigest()


def signature_holds(checkpoint: AuditCheckpoint) -> bool:
    return hmac.compare_digest(checkpoint_signature(checkpoint), checkpoint.signature)


def checkpoints_of(chain: str) -> tuple[dict[int, AuditCheckpoint], AuditCheckpoint | None]:
    """A chain's checkpoints by the seq they sign, and the first whose signature does not hold
    (None when all do)."""
    found = {}
    for checkpoint in AuditCheckpoint.objects.filter(chain=chain).order_by("count"):
        if not signature_holds(checkpoint):
            return found, checkpoint
        found[checkpoint.count] = checkpoint
    return found, None
