"""``Idempotency-Key`` on the POSTs that create, job submission included: a client (a CI
pipeline, an SDK retrying after a timeout) that sends the same key again gets the first response
back, marked ``Idempotent-Replayed: true``, and nothing is created twice.

The record is inserted in the same transaction as the create, before it: a concurrent retry
with the same key waits on the unique index until the first commits, then replays it; if the
create fails, the record rolls back with it and the key may be used again. A key is per user
and per path, and kept for ``IDEMPOTENCY_TTL``; the same key with a different body (compared by
the SHA-256 of its canonical JSON) is a 409 ``idempotency_key_reused``.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import re

from django.db import IntegrityError, transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter
from rest_framework import exceptions
from rest_framework.response import Response

from audit.chain import canonical_json
from config import secrets
from config.errors import Conflict

from ..models import IdempotencyRecord

IDEMPOTENCY_TTL = dt.timedelta(hours=24)
HEADER = "Idempotency-Key"
# What a client may send as a key: what fits the column, and nothing the database or a log line
# would choke on (a NUL, a line break, a lone surrogate).
KEY = re.compile(r"[\x20-\x7e]{1,255}")
KEY_RULE = "1 to 255 printable ASCII characters"
REPLAYED = "Idempotent-Replayed"

IDEMPOTENCY_KEY = OpenApiParameter(
    HEADER,
    str,
    OpenApiParameter.HEADER,
    description="Send the same key again (within 24 h, with the same body) to get the first "
    "response back, with `Idempotent-Replayed: true`, instead of creating a second object.",
)


class IdempotencyKeyReused(Conflict):
    type = "idempotency_key_reused"


def _fingerprint(data) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def idempotent(create=None, *, replay_status: int | None = None):
    """Decorate a viewset's ``create``: ``@idempotent``, or ``@idempotent(replay_status=200)``
    to answer a replay with that status rather than the first response's."""
    if create is None:
        return functools.partial(idempotent, replay_status=replay_status)

    @functools.wraps(create)
    def wrapper(self, request, *args, **kwargs):
        key = request.headers.get(HEADER)
        if not key:
            return create(self, request, *args, **kwargs)
        if not KEY.fullmatch(key):
            raise exceptions.ValidationError({HEADER: [KEY_RULE]})
        fingerprint = _fingerprint(request.data)
        scope = {"user": request.user, "key": key, "path": request.path[:500]}
        with transaction.atomic():
            IdempotencyRecord.objects.filter(
                **scope, created_at__lt=timezone.now() - IDEMPOTENCY_TTL
            ).delete()
            try:
                with transaction.atomic():
                    record = IdempotencyRecord.objects.create(**scope, fingerprint=fingerprint)
            except IntegrityError:  # the first request with this key has committed
                record = IdempotencyRecord.objects.get(**scope)
                return _replay(record, fingerprint, replay_status)
            response = create(self, request, *args, **kwargs)
            if not 200 <= response.status_code < 300:
                transaction.set_rollback(True)  # nothing was created: the key stays free
                return response
            record.status_code = response.status_code
            record.response_encrypted = secrets.encrypt(json.dumps(response.data, default=str))
            record.save(update_fields=["status_code", "response_encrypted"])
        return response

    return wrapper


def _replay(record: IdempotencyRecord, fingerprint: str, status: int | None) -> Response:
    if record.fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was used with a different request body",
            errors={HEADER: ["already used with a different body; use a new key"]},
        )
    data = json.loads(secrets.decrypt(record.response_encrypted))
    return Response(data, status=status or record.status_code, headers={REPLAYED: "true"})
