"""What can go wrong talking to Manta, as exceptions a caller can tell apart."""

from __future__ import annotations

from typing import Any

import httpx


class MantaError(Exception):
    """Base of every error this package raises."""


class ApiError(MantaError):
    """The API answered with an error. ``type``, ``detail`` and ``errors`` are the fields of its
    error body (``{"type", "detail", "errors": {field: [message, …]}}``); ``status`` is the HTTP
    status and ``request_id`` the server's ``X-Request-ID``, to quote when asking for help."""

    def __init__(
        self,
        status: int,
        type: str,
        detail: str,
        errors: dict[str, list[str]] | None = None,
        *,
        request_id: str = "",
    ):
        super().__init__(f"{status} {type}: {detail}")
        self.status = status
        self.type = type
        self.detail = detail
        self.errors = errors or {}
        self.request_id = request_id

    @property
    def is_api_body(self) -> bool:
        """Whether the server answered in the API's error format (an unknown route does not)."""
        return self.type != NOT_AN_API_ERROR

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        request_id = response.headers.get("X-Request-ID", "")
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("type"), str):
            errors = body.get("errors") if isinstance(body.get("errors"), dict) else {}
            return cls(
                response.status_code,
                body["type"],
                str(body.get("detail", "")),
                {str(k): _messages(v) for k, v in errors.items()},
                request_id=request_id,
            )
        text = response.text.strip()
        detail = text[:300] if text and not text.lstrip().startswith("<") else ""
        return cls(
            response.status_code,
            NOT_AN_API_ERROR,
            detail or f"{response.status_code} {response.reason_phrase} for {response.url}",
            request_id=request_id,
        )


class ConnectionFailed(MantaError):
    """The server could not be reached or did not answer in time (after the retries)."""


NOT_AN_API_ERROR = "http_error"


def _messages(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(item) for item in value]
    return [str(value)]
