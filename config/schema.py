"""The OpenAPI schema documents every error status an operation can answer with, all with the one
error body of :mod:`config.errors`, so generated clients parse errors instead of dropping them."""

from __future__ import annotations

from typing import Any

from drf_spectacular import openapi
from rest_framework import serializers

WRITES = {"POST", "PUT", "PATCH", "DELETE"}
# Pagination's own parameters are never refused: a bad page_size falls back to the default and
# a page past the end is a 404.
PAGINATION_PARAMETERS = {"page", "page_size"}


class ErrorSerializer(serializers.Serializer):
    """The body of every error response."""

    # Mirrors config.errors.exception_handler: all three keys, always; ``errors`` may be empty.

    type = serializers.CharField(
        help_text="Stable, machine-readable kind: validation_error, parse_error, "
        "not_authenticated, authentication_failed, permission_denied, not_found, conflict, "
        "invalid_transition, idempotency_key_reused, budget_exhausted, workspace_archived, "
        "payload_too_large, throttled, queue_full, …"
    )
    detail = serializers.CharField(help_text="One human-readable sentence")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="Messages per field (dotted path for nested fields); empty when the error is "
        "not about particular fields",
    )


def _error(type_: str, detail: str, errors: dict[str, list[str]] | None = None) -> dict:
    return {"type": type_, "detail": detail, "errors": errors or {}}


# status: (description, example body)
ERRORS: dict[str, tuple[str, dict]] = {
    "400": (
        "Invalid input: `errors` has the messages per field",
        _error(
            "validation_error",
            "name: This field is required.",
            {"name": ["This field is required."]},
        ),
    ),
    "401": (
        "Not authenticated: no or an invalid token",
        _error("not_authenticated", "Authentication credentials were not provided."),
    ),
    "403": (
        "Permission denied",
        _error("permission_denied", "You do not have permission to perform this action."),
    ),
    "404": ("Not found (or not visible to you)", _error("not_found", "Not found.")),
    "409": (
        "Conflict: invalid state transition, idempotency key reuse, exhausted budget, or an "
        "archived (read-only) workspace",
        _error(
            "invalid_transition",
            "job 42 is succeeded; it cannot become cancelled",
            {"state": ["succeeded → cancelled is not allowed"]},
        ),
    ),
    "413": (
        "The body is larger than the limit (DATA_UPLOAD_MAX_MEMORY_SIZE)",
        _error("payload_too_large", "the body is larger than the limit of 2621440 bytes"),
    ),
    "429": (
        "Too many requests / queue full",
        _error(
            "queue_full",
            "the workspace already has 20 waiting jobs (max_queued_jobs 20); try again when "
            "some have started",
            {"max_queued_jobs": ["20"]},
        ),
    ),
}
# An anonymous operation (issuing a token) answers 401 to wrong credentials, not to a token.
ANONYMOUS_401 = (
    "Authentication failed: invalid credentials",
    _error("authentication_failed", "invalid email or password"),
)
PAGE_404 = (
    "Not found (or not visible to you), or a page past the end",
    _error("not_found", "Invalid page."),
)


def error_statuses(method: str, operation: dict[str, Any]) -> dict[str, tuple[str, dict]]:
    """The error statuses an operation can answer with, from what the operation declares."""
    security = operation.get("security") or []
    anonymous = not security or {} in security
    parameters = operation.get("parameters", [])
    where = {p["in"] for p in parameters}
    query = {p["name"] for p in parameters if p["in"] == "query"}
    paginated = "page" in query
    # A list refuses query parameters it does not take (config/strict.py): a 400 too.
    validates = (
        method in WRITES
        or "requestBody" in operation
        or bool(query - PAGINATION_PARAMETERS)
        or paginated
    )

    statuses = {}
    if validates:
        statuses["400"] = ERRORS["400"]
    if not anonymous:
        statuses["401"] = ERRORS["401"]
        statuses["403"] = ERRORS["403"]
    elif method in WRITES:  # an anonymous write checks credentials of its own (a login)
        statuses["401"] = ANONYMOUS_401
    if "path" in where:
        statuses["404"] = ERRORS["404"]
    if paginated:
        statuses["404"] = PAGE_404
    if method in WRITES:
        statuses["409"] = ERRORS["409"]
    if "requestBody" in operation:  # a body read into memory has a size limit
        statuses["413"] = ERRORS["413"]
    statuses["429"] = ERRORS["429"]
    return statuses


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's AutoSchema, plus the error responses of :func:`error_statuses`."""

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        ref = self.resolve_serializer(ErrorSerializer, "response").ref
        responses = operation["responses"]
        for status, (description, example) in error_statuses(self.method, operation).items():
            # A status the view documents itself (the upload's 413, say) knows better.
            responses.setdefault(
                status,
                {
                    "description": description,
                    "content": {
                        "application/json": {
                            "schema": ref,
                            "examples": {example["type"]: {"value": example}},
                        }
                    },
                },
            )
        operation["responses"] = dict(sorted(responses.items()))
        return operation
