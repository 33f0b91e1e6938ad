"""How the CLI shows things: Rich tables for people, JSON on stdout for scripts, errors on
stderr either way."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.table import Table

from .errors import ApiError
from .follow import describe
from .responses import Job, Template
from .terminal import escape_controls

STATE_STYLES = {
    "pending_approval": "yellow",
    "queued": "cyan",
    "launching": "blue",
    "running": "bold blue",
    "preempting": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "rejected": "red",
}


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


def stdout() -> Console:
    return Console(file=sys.stdout, highlight=False)


def stderr() -> Console:
    # Messages are not wrapped at the console's width: a script greps them whole.
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def print_error(message: str, *, as_json: bool, details: dict[str, Any] | None = None) -> None:
    if as_json:
        sys.stderr.write(json.dumps({"detail": message, **(details or {})}) + "\n")
    else:
        stderr().print(f"[bold red]Error:[/] {escape(message)}")


def print_api_error(exc: ApiError, *, as_json: bool) -> None:
    """The API's ``detail`` and each field's messages, on stderr."""
    if as_json:
        body = {"status": exc.status, "type": exc.type, "detail": exc.detail, "errors": exc.errors}
        sys.stderr.write(json.dumps(body) + "\n")
        return
    console = stderr()
    console.print(f"[bold red]Error:[/] {escape(exc.detail)} [dim]({exc.status} {exc.type})[/]")
    for field, messages in exc.errors.items():
        for message in messages:
            console.print(f"  [bold]{escape(field)}[/]: {escape(message)}")
    if exc.status == 401:
        console.print("  Run [bold]manta login[/] (or set MANTA_TOKEN) for a valid token.")


def escape(text: str) -> str:
    """Server text made safe to print: Rich markup and terminal control characters escaped
    (names, reasons and messages are tenant input, some written by a job)."""
    from rich.markup import escape as rich_escape

    return rich_escape(escape_controls(str(text)))


def state_text(state: str) -> str:
    return f"[{STATE_STYLES.get(state, 'default')}]{state}[/]"


def resources(requested: dict[str, float] | None) -> str:
    if not requested:
        return ""
    parts = [f"{requested.get('cpu', 0):g} cpu", f"{requested.get('memory_gb', 0):g} GB"]
    if requested.get("gpu"):
        parts.append(f"{requested['gpu']:g} gpu")
    return ", ".join(parts)


def jobs_table(jobs: list[Job]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "STATE", "TEMPLATE", "REQUESTED", "SUBMITTED BY", "CREATED"):
        table.add_column(column)
    for job in jobs:
        template = job.get("template") or {}
        table.add_row(
            str(job["id"]),
            escape(job.get("name", "")),
            state_text(job.get("state", "")),
            escape(template.get("name", "") if template else "ad hoc"),
            resources(job.get("requested")),
            escape(job.get("submitted_by", "")),
            (job.get("created_at") or "")[:19].replace("T", " "),
        )
    return table


def job_detail(job: Job) -> list[Any]:
    """A job as a few lines and its attempts as a table."""
    template = job.get("template")
    summary = describe(job)
    lines: list[Any] = [
        f"[bold]job {job['id']}[/] {escape(job.get('name', ''))}: {state_text(job['state'])}",
        *([f"  {escape(summary)}"] if summary != job["state"] else []),
        f"  template:  {escape(template['name'])} v{job.get('template_version')}"
        if template
        else "  template:  (ad hoc)",
        f"  requested: {resources(job.get('requested'))}, priority {job.get('priority')}",
        f"  submitted: {escape(job.get('submitted_by', ''))} at {job.get('created_at', '')}",
    ]
    if job.get("approval_required"):
        lines.append(f"  approval:  {escape(job.get('approval_reason', ''))}")
    predicted = (job.get("queue") or {}).get("predicted_start")
    if predicted:
        lines.append(f"  expected:  {escape(expected_start(predicted))}")
    entrypoint = (job.get("spec") or {}).get("entrypoint")
    if entrypoint:
        lines.append(f"  entrypoint: {escape(entrypoint)}")
    attempts = job.get("attempts") or []
    if attempts:
        table = Table(box=None, header_style="bold", padding=(0, 1))
        for column in ("ATTEMPT", "STATE", "RAY", "EXIT", "FAILURE", "DASHBOARD"):
            table.add_column(column)
        for attempt in attempts:
            exit_code = attempt.get("exit_code")
            table.add_row(
                str(attempt.get("number")),
                escape(attempt.get("state", "")),
                escape(attempt.get("ray_status", "")),
                "" if exit_code is None else str(exit_code),
                escape(attempt.get("failure_reason", "")),
                escape(attempt.get("dashboard_url", "")),
            )
        lines.append(table)
    return lines


def templates_table(templates: list[Template]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "VERSION", "IMAGE", "OVERRIDABLE", "DESCRIPTION"):
        table.add_column(column)
    for template in templates:
        table.add_row(
            str(template["id"]),
            escape(template.get("name", "")),
            str(template.get("version", "")),
            escape((template.get("spec") or {}).get("image", "")),
            escape(", ".join(template.get("allowed_overrides") or [])),
            escape(template.get("description", "")),
        )
    return table


def sources_table(sources: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "URL", "DEFAULT REF", "DEPLOY KEY"):
        table.add_column(column)
    for source in sources:
        table.add_row(
            escape(source.get("name", "")),
            escape(source.get("url", "")),
            escape(source.get("default_ref", "")),
            "yes" if source.get("has_deploy_key") else "no",
        )
    return table


def events_table(events: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("AT", "EVENT", "FROM", "TO", "BY", "REASON"):
        table.add_column(column)
    for event in events:
        table.add_row(
            (event.get("created_at") or "")[:19].replace("T", " "),
            escape(event.get("kind", "")),
            escape(event.get("from_state", "")),
            escape(event.get("to_state", "")),
            escape(event.get("actor", "")),
            escape(event.get("reason", "")),
        )
    return table


def quota_table(quota: dict[str, Any], usage: dict[str, Any]) -> list[Any]:
    table = Table(box=None, header_style="bold")
    for column in ("RESOURCE", "RESERVED", "GUARANTEED", "LIMIT"):
        table.add_column(column, justify="right" if column != "RESOURCE" else "left")

    def amount(value: Any) -> str:
        return "unlimited" if value is None else f"{value:g}"

    for key in ("cpu", "memory_gb", "gpu"):
        table.add_row(
            key,
            amount(usage.get("reserved", {}).get(key, 0)),
            amount(quota.get(f"guaranteed_{key}", 0)),
            amount(quota.get(f"limit_{key}")),
        )
    budget = quota.get("gpu_hours_per_month")
    return [
        table,
        f"jobs: {usage.get('running', 0)} running (max {amount(quota.get('max_running_jobs'))}),"
        f" {usage.get('queued', 0)} queued (max {amount(quota.get('max_queued_jobs'))}),"
        f" {usage.get('pending_approval', 0)} pending approval",
        f"gpu-hours this month: {usage.get('gpu_hours_this_month', 0):g}"
        + ("" if budget is None else f" of {budget:g} ({quota.get('budget_action', '')})"),
    ]


def show_job(job: Job, *, as_json: bool, submitted: bool = False) -> None:
    if as_json:
        print_json(job)
        return
    console = stdout()
    if submitted:
        console.print(f"submitted job [bold]{job['id']}[/] ({escape(job.get('name', ''))})")
    for line in job_detail(job):
        console.print(line)


def expected_start(predicted: dict[str, Any]) -> str:
    """A predicted start (``p50``, ``p90``) in words."""
    if not predicted.get("p50"):
        return f"no predicted start: {predicted.get('why_unknown') or 'it may never fit'}"
    p50, p90 = (str(predicted.get(key) or "")[:19].replace("T", " ") for key in ("p50", "p90"))
    return f"to start around {p50} UTC (by {p90} UTC at the 90th percentile)"


def show_dry_run(answer: dict[str, Any], *, as_json: bool) -> None:
    """What ``manta submit --dry-run`` answers: nothing was submitted."""
    if as_json:
        print_json(answer)
        return
    console = stdout()
    if answer.get("would_admit_now"):
        console.print("dry run: the job would be admitted now (nothing was submitted)")
    else:
        state = answer.get("state", "")
        why = answer.get("waiting_for") or answer.get("blocker") or "its place in the queue"
        where = "pending approval" if state == "pending_approval" else "queued"
        console.print(
            f"dry run: the job would wait, {where}, at position {answer.get('position')}: "
            f"{escape(why)} (nothing was submitted)"
        )
        if answer.get("approval_reason"):
            console.print(f"  approval:  {escape(answer['approval_reason'])}")
    console.print(f"  requested: {resources(answer.get('requested'))}")
    console.print(f"  expected:  {escape(expected_start(answer.get('predicted_start') or {}))}")
