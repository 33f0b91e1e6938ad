"""``manta jobs …``, ``manta templates …`` and ``manta quota``: reading the workspace, and
deciding on its jobs."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .. import output
from ..terminal import escape_controls
from . import common
from .common import OutputOption, RawOption, UsageProblem, info, use
from .watch import finish, follow_until_done

jobs_app = typer.Typer(help="List, inspect, follow and decide on jobs.", no_args_is_help=True)
templates_app = typer.Typer(help="The workspace's job templates.", no_args_is_help=True)
sources_app = typer.Typer(help="The workspace's git code sources.", no_args_is_help=True)

JobId = Annotated[int, typer.Argument(help="The job's id")]
Reason = Annotated[str, typer.Option(help="Why (kept in the job's timeline)")]


@jobs_app.command("ls")
def jobs_ls(
    ctx: typer.Context,
    states: Annotated[
        list[str] | None, typer.Option("--state", help="Only jobs in this state (repeatable)")
    ] = None,
    template: Annotated[str | None, typer.Option(help="Only jobs of this template (name)")] = None,
    submitter: Annotated[str | None, typer.Option(help="Only jobs submitted by this email")] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only your jobs")] = False,
    limit: Annotated[int, typer.Option(help="At most this many, newest first", min=1)] = 20,
    output_format: OutputOption = None,
) -> None:
    """The workspace's jobs, newest first."""
    state = use(ctx, output_format)
    with common.client() as client:
        template_id = None
        if template:
            found = client.find_template(template)
            if found is None:
                raise UsageProblem(f"no template named {template!r}")
            template_id = found["id"]
        if mine:
            submitter = client.me()["email"]
        jobs = client.jobs(state=states, template=template_id, submitter=submitter, limit=limit)
    if state.as_json:
        output.print_json(jobs)
    elif not jobs:
        info("no jobs")
    else:
        output.stdout().print(output.jobs_table(jobs))


@jobs_app.command("get")
def jobs_get(ctx: typer.Context, job_id: JobId, output_format: OutputOption = None) -> None:
    """A job: its state, why it waits, its attempts."""
    state = use(ctx, output_format)
    with common.client() as client:
        job = client.job(job_id)
    output.show_job(job, as_json=state.as_json)


@jobs_app.command("logs")
def jobs_logs(
    ctx: typer.Context,
    job_id: JobId,
    follow_job: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option(help="This attempt's log (default: the latest)", min=1)
    ] = None,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines", min=1)] = None,
    raw: RawOption = False,
    output_format: OutputOption = None,
) -> None:
    """The job's driver log; with -f until the job ends (exit 0 if it succeeded, 1 if not).

    The job wrote it: its control characters are shown escaped (ESC as \\x1b) unless --raw.
    """
    state = use(ctx, output_format)
    if follow_job and (attempt is not None or tail is not None):
        raise UsageProblem(
            "--follow prints the latest attempt and each new one: drop --attempt/--tail"
        )
    with common.client() as client:
        if follow_job:
            final = follow_until_done(
                client, client.job(job_id), state, offer_cancel=False, raw=raw
            )
        else:
            body = client.job_logs(job_id, attempt=attempt, tail=tail)
    if follow_job:
        finish(state, final)
    elif state.as_json:
        output.print_json(body)
    else:
        sys.stdout.write(body["logs"] if raw else escape_controls(body["logs"]))
        sys.stdout.flush()


@jobs_app.command("events")
def jobs_events(ctx: typer.Context, job_id: JobId, output_format: OutputOption = None) -> None:
    """The job's timeline: every state change, who made it and why."""
    state = use(ctx, output_format)
    with common.client() as client:
        events = client.job_events(job_id)
    if state.as_json:
        output.print_json(events)
    else:
        output.stdout().print(output.events_table(events))


@jobs_app.command("cancel")
def jobs_cancel(
    ctx: typer.Context, job_id: JobId, reason: Reason = "", output_format: OutputOption = None
) -> None:
    """Cancel a job (your own, or any as a workspace admin)."""
    state = use(ctx, output_format)
    with common.client() as client:
        output.show_job(client.cancel_job(job_id, reason), as_json=state.as_json)


@jobs_app.command("approve")
def jobs_approve(
    ctx: typer.Context, job_id: JobId, reason: Reason = "", output_format: OutputOption = None
) -> None:
    """Approve a job that waits for approval (workspace and org admins; not your own job)."""
    state = use(ctx, output_format)
    with common.client() as client:
        output.show_job(client.approve_job(job_id, reason), as_json=state.as_json)


@jobs_app.command("reject")
def jobs_reject(
    ctx: typer.Context,
    job_id: JobId,
    reason: Annotated[str, typer.Option(help="Why (the submitter sees it)")],
    output_format: OutputOption = None,
) -> None:
    """Reject a job that waits for approval."""
    state = use(ctx, output_format)
    with common.client() as client:
        output.show_job(client.reject_job(job_id, reason), as_json=state.as_json)


@templates_app.command("ls")
def templates_ls(ctx: typer.Context, output_format: OutputOption = None) -> None:
    """The workspace's templates."""
    state = use(ctx, output_format)
    with common.client() as client:
        templates = client.templates()
    if state.as_json:
        output.print_json(templates)
    elif not templates:
        info("no templates")
    else:
        output.stdout().print(output.templates_table(templates))


@templates_app.command("get")
def templates_get(
    ctx: typer.Context,
    template: Annotated[str, typer.Argument(help="The template's name (or id)")],
    output_format: OutputOption = None,
) -> None:
    """A template: its latest version's spec and what a submitter may override."""
    state = use(ctx, output_format)
    with common.client() as client:
        found = client.find_template(template)
        if found is None and template.isdigit():
            found = client.template(int(template))
    if found is None:
        raise UsageProblem(f"no template named {template!r}")
    if state.as_json:
        output.print_json(found)
        return
    console = output.stdout()
    title = output.escape(found["name"])
    console.print(f"[bold]{title}[/] (id {found['id']}, version {found.get('version')})")
    if found.get("description"):
        console.print(output.escape(found["description"]))
    overridable = ", ".join(found.get("allowed_overrides") or []) or "nothing"
    console.print(f"overridable: {output.escape(overridable)}")
    # ASCII: JSON escapes C0 controls, but would print DEL and C1 controls as they are.
    console.print_json(data=found.get("spec") or {}, ensure_ascii=True)


@sources_app.command("ls")
def sources_ls(ctx: typer.Context, output_format: OutputOption = None) -> None:
    """The workspace's code sources (submit --source NAME --ref REF runs one of them)."""
    state = use(ctx, output_format)
    with common.client() as client:
        sources = client.code_sources()
    if state.as_json:
        output.print_json(sources)
    elif not sources:
        info("no code sources")
    else:
        output.stdout().print(output.sources_table(sources))


def quota(ctx: typer.Context, output_format: OutputOption = None) -> None:
    """The workspace's quota and what it uses now."""
    state = use(ctx, output_format)
    with common.client() as client:
        limits, usage = client.quota(), client.usage()
    if state.as_json:
        output.print_json({"quota": limits, "usage": usage})
        return
    console = output.stdout()
    for line in output.quota_table(limits, usage):
        console.print(line)
