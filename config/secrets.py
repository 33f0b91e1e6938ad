"""Encryption of secrets at rest (compute target tokens, launcher handles).

Fernet (AES-128-CBC + HMAC-SHA256) with a key from ``MANTA_ENCRYPTION_KEY``, or derived from
``SECRET_KEY`` when that is not set. Rotating the key makes stored secrets unreadable: re-enter
them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


@cache
def _fernet(key_material: str) -> Fernet:
    key = base64.urlsafe_b64encode(hashlib.sha256(key_material.encode()).digest())
    return Fernet(key)


def _current() -> Fernet:
    return _fernet(settings.MANTA_ENCRYPTION_KEY or settings.SECRET_KEY)


def encrypt(value: str) -> str:
    return _current().encrypt(value.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _current().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise ValueError("cannot decrypt: the encryption key changed") from exc


def encrypt_json(value: Any) -> str:
    return encrypt(json.dumps(value))


def decrypt_json(token: str) -> Any:
    return json.loads(decrypt(token)) if token else None
