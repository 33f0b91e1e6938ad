"""The shapes of the API's answers that the SDK's callers read most (the API sends more fields;
they are in the dicts too)."""

from __future__ import annotations

from typing import Any, TypedDict


class Token(TypedDict, total=False):
    id: int
    token: str
    name: str
    prefix: str
    created_at: str
    expires_at: str | None


class Package(TypedDict, total=False):
    sha256: str
    size: int
    uri: str
    created_at: str


class JobLogs(TypedDict):
    attempt: int | None
    source: str
    logs: str
    offset: int


class Attempt(TypedDict, total=False):
    number: int
    state: str
    cluster_name: str
    dashboard_url: str
    ray_status: str
    ray_message: str
    exit_code: int | None
    failure_reason: str
    launch_started_at: str | None
    cluster_ready_at: str | None
    submitted_at: str | None
    running_at: str | None
    finished_at: str | None


class Job(TypedDict, total=False):
    id: int
    name: str
    state: str
    template: dict[str, Any] | None
    template_version: int | None
    spec: dict[str, Any]
    requested: dict[str, float]
    priority: int
    submitted_by: str
    approval_required: bool
    approval_reason: str
    decision_reason: str
    failure_reason: str
    message: str
    created_at: str
    attempts: list[Attempt]
    queue: dict[str, Any] | None


class Template(TypedDict, total=False):
    id: int
    name: str
    description: str
    version: int
    spec: dict[str, Any]
    allowed_overrides: list[str]


TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "rejected"})
