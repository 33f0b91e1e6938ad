"""Who is acting and from where: the actor passed to services, and the request context that the
middleware sets for the duration of one HTTP request (request id, client IP, user agent)."""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Actor:
    """The principal behind a write. ``user`` is None only for the system (workers, beat)."""

    kind: str  # "user" (session, admin panel, command), "token" (API token) or "system"
    user: Any = None
    token_id: int | None = None
    label: str = ""

    @classmethod
    def for_user(cls, user: Any, *, token_id: int | None = None) -> Actor:
        return cls(
            kind="token" if token_id else "user", user=user, token_id=token_id, label=user.email
        )

    @classmethod
    def system(cls, name: str = "manta") -> Actor:
        return cls(kind="system", label=f"system:{name}")

    @classmethod
    def from_request(cls, request: Any) -> Actor:
        token = getattr(request, "auth", None)
        return cls.for_user(request.user, token_id=getattr(token, "pk", None))

    @property
    def user_id(self) -> int | None:
        return getattr(self.user, "pk", None)


@dataclasses.dataclass(frozen=True)
class RequestContext:
    request_id: str = ""
    ip: str | None = None
    user_agent: str = ""


_NO_REQUEST = RequestContext()
_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "manta_request_context", default=None
)


def current_request() -> RequestContext:
    return _current.get() or _NO_REQUEST


def set_request(ctx: RequestContext) -> contextvars.Token:
    return _current.set(ctx)


def reset_request(token: contextvars.Token) -> None:
    _current.reset(token)
