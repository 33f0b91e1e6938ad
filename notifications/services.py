"""Emitting domain events. Callers are inside the transaction of the change."""

from __future__ import annotations

import json
from typing import Any

from .models import DomainEvent


def event_emit(
    *, type: str, organization: Any, workspace: Any = None, payload: dict[str, Any]
) -> DomainEvent:
    return DomainEvent.objects.create(
        type=type,
        organization=organization,
        workspace=workspace,
        payload=json.loads(json.dumps(payload, default=str)),
    )
