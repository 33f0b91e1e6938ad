"""One error contract for the whole API: ``{"type", "detail", "errors"}`` with a 4xx status.

Services raise :class:`DomainError` subclasses (one per meaning, with a stable ``type``); DRF's own
exceptions and Django's ``ValidationError`` are translated here too, so a client never has to parse
two shapes.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response


class DomainError(Exception):
    """A business rule said no. Subclasses set ``type`` and ``status_code``."""

    type = "domain_error"
    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, detail: str, *, errors: dict[str, list[str]] | None = None):
        super().__init__(detail)
        self.detail = detail
        self.errors = errors or {}


class InvalidInput(DomainError):
    """Input that fails a rule only a service can check (it needs other rows to decide)."""

    type = "validation_error"

    @classmethod
    def on(cls, field: str, message: str) -> InvalidInput:
        return cls(message, errors={field: [message]})


def clean_or_raise(instance: Any, **kwargs: Any) -> None:
    """``instance.full_clean()``, with model validation errors raised as :class:`InvalidInput`
    (so services called from commands and workers speak the same error contract as the API)."""
    try:
        instance.full_clean(**kwargs)
    except DjangoValidationError as exc:
        errors = exc.message_dict
        field, messages = next(iter(errors.items()))
        raise InvalidInput(f"{field}: {messages[-1]}", errors=errors) from exc


def invalid_from_serializer(exc: exceptions.ValidationError, prefix: str = "") -> InvalidInput:
    """A serializer's ValidationError as InvalidInput, its field names under ``prefix``."""
    errors = field_errors(exc.detail)
    if prefix:
        errors = {f"{prefix}.{key}": value for key, value in errors.items()}
    return InvalidInput(summarize(errors), errors=errors)


class UnparsableBody(InvalidInput):
    """A request body the API will not read (config/parsers.py): nested too deep, or holding a
    string, key or number PostgreSQL cannot store."""

    type = "parse_error"


class PayloadTooLarge(DomainError):
    type = "payload_too_large"
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE


class Conflict(DomainError):
    type = "conflict"
    status_code = status.HTTP_409_CONFLICT


class Forbidden(DomainError):
    type = "permission_denied"
    status_code = status.HTTP_403_FORBIDDEN


class InvalidCredentials(DomainError):
    type = "authentication_failed"
    status_code = status.HTTP_401_UNAUTHORIZED


class NotFound(DomainError):
    type = "not_found"
    status_code = status.HTTP_404_NOT_FOUND


_DRF_TYPES = {
    exceptions.ValidationError: "validation_error",
    exceptions.ParseError: "parse_error",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}


def _drf_type(exc: exceptions.APIException) -> str:
    for cls, name in _DRF_TYPES.items():
        if isinstance(exc, cls):
            return name
    return exc.default_code or "error"


def field_errors(detail: Any) -> dict[str, list[str]]:
    """Flatten DRF's nested error detail into ``{"a.b.0.c": ["msg"]}``."""
    out: dict[str, list[str]] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), sub)
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            out.setdefault(prefix or "non_field_errors", []).extend(str(v) for v in value)
        elif isinstance(value, list):
            for index, sub in enumerate(value):
                if sub:
                    walk(f"{prefix}.{index}" if prefix else str(index), sub)
        else:
            out.setdefault(prefix or "non_field_errors", []).append(str(value))

    walk("", detail)
    return out


def summarize(errors: dict[str, list[str]]) -> str:
    field, messages = next(iter(errors.items()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{field}: {messages[0]}{more}"


def exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, RequestDataTooBig):
        # Django raises it when DRF reads the body; unhandled, Django would answer an HTML 400.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        exc = PayloadTooLarge(
            f"the request body is larger than the limit of {limit} bytes "
            "(DATA_UPLOAD_MAX_MEMORY_SIZE)"
        )
    if isinstance(exc, DomainError):
        body = {"type": exc.type, "detail": exc.detail, "errors": exc.errors}
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return Response(body, status=exc.status_code, headers=headers)
    if isinstance(exc, DjangoValidationError):
        detail = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        exc = exceptions.ValidationError(detail)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    # Imported here: rest_framework.views loads the authentication classes, which import services,
    # which import this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = field_errors(exc.detail)
        detail = summarize(errors) if errors else "Invalid input."
    else:
        errors = {}
        detail = str(exc.detail) if hasattr(exc, "detail") else str(exc)
    response.data = {"type": _drf_type(exc), "detail": detail, "errors": errors}
    return response
