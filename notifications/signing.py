"""Standard Webhooks signatures.

A secret is ``whsec_`` + base64 of random bytes; the HMAC key is those bytes (the base64 part
decoded). The signature of a message is ``v1,`` + base64(HMAC-SHA256(key, "{id}.{ts}.{body}"));
the ``webhook-signature`` header carries one per valid secret, separated by spaces, so a receiver
holding either the old or the new secret accepts messages during a rotation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
SECRET_BYTES = 32  # the specification asks for 24 to 64


def secret_generate() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64>`` for one secret."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets_: list[str], message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, message_id, timestamp, body) for s in secrets_),
    }
