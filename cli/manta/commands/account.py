"""Logging in and out, and choosing the organisation and workspace the other commands act in."""

from __future__ import annotations

import os
import socket
from typing import Annotated

import typer

from .. import config, output
from ..client import Client
from ..errors import ApiError
from .common import OutputOption, UsageProblem, info, require_login, use


def login(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option(help="The Manta server, e.g. https://manta.example")
    ] = None,
    email: Annotated[str | None, typer.Option(help="Your account's email")] = None,
    expires_in_days: Annotated[
        int | None, typer.Option(help="The token expires after this many days", min=1)
    ] = None,
    output_format: OutputOption = None,
) -> None:
    """Log in with your email and password; the token is stored for the next commands."""
    state = use(ctx, output_format)
    stored = config.load()
    url = (url or os.environ.get("MANTA_URL") or stored.url or "").rstrip("/")
    if not url:
        url = typer.prompt("Manta URL", default="http://127.0.0.1:8000", err=True).rstrip("/")
    if not email:
        email = typer.prompt("Email", default=stored.email or None, err=True)
    password = typer.prompt("Password", hide_input=True, err=True)
    name = f"manta-cli on {socket.gethostname()}"[:100]
    with Client(url) as anonymous:
        token = anonymous.create_token(
            email=email, password=password, name=name, expires_in_days=expires_in_days
        )
    with Client(url, token["token"]) as client:
        me = client.me()
        same_server = stored.url.rstrip("/") == url
        org = stored.org if same_server else ""
        workspace = stored.workspace if same_server else ""
        orgs = [o["slug"] for o in me.get("organizations", [])]
        if org not in orgs:
            org, workspace = (orgs[0] if len(orgs) == 1 else ""), ""
        if org and not workspace:
            workspace = only_workspace(client, org)
    new = config.StoredConfig(
        url=url,
        token=token["token"],
        token_id=token.get("id"),
        email=me.get("email", email),
        org=org,
        workspace=workspace,
    )
    path = config.save(new)
    if state.as_json:
        output.print_json(
            {
                "url": url,
                "email": new.email,
                "org": org,
                "workspace": workspace,
                "config": str(path),
            }
        )
    else:
        info(f"Logged in to {url} as {new.email}; the token is stored in {path}")
        if org:
            info(f"Context: org {org}, workspace {workspace or '(none yet: manta context)'}")
    if os.environ.get("MANTA_TOKEN"):
        info("Note: MANTA_TOKEN is set in the environment and is used instead of this login.")


def only_workspace(client: Client, org: str) -> str:
    """The organisation's workspace when the user sees exactly one ('' otherwise)."""
    workspaces = [w for w in client.workspaces(org) if not w.get("archived_at")]
    return workspaces[0]["slug"] if len(workspaces) == 1 else ""


def logout(ctx: typer.Context) -> None:
    """Revoke the stored token and forget it."""
    stored = config.load()
    if not stored.token:
        info("Not logged in.")
        return
    if stored.token_id is not None:
        with Client(stored.url, stored.token) as client:
            try:
                client.revoke_token(stored.token_id)
            except ApiError as exc:
                if exc.status != 401:  # an expired or revoked token is gone already
                    raise
    stored.token, stored.token_id = "", None
    config.save(stored)
    info(f"Logged out of {stored.url}.")


def context(
    ctx: typer.Context,
    org: Annotated[str | None, typer.Option("--org", help="Switch to this organisation")] = None,
    workspace: Annotated[
        str | None, typer.Option("--workspace", help="Switch to this workspace")
    ] = None,
    output_format: OutputOption = None,
) -> None:
    """Show the current organisation and workspace, or switch with --org / --workspace."""
    state = use(ctx, output_format)
    stored = config.load()
    current = config.resolve(stored)
    require_login(current)
    with Client(current.url, current.token) as client:
        if org or workspace:
            _switch(client, stored, current, org, workspace)
            current = config.resolve(stored)
        me = client.me()
        workspaces = client.workspaces(current.org) if current.org else []
    body = {
        "url": current.url,
        "email": me.get("email"),
        "org": current.org,
        "workspace": current.workspace,
        "sources": current.sources,
        "organizations": me.get("organizations", []),
        "workspaces": [w["slug"] for w in workspaces],
    }
    if state.as_json:
        output.print_json(body)
        return
    console = output.stdout()

    def line(label: str, value: str, name: str) -> None:
        where = current.sources.get(name)
        note = f" [dim](from {config.ENV_NAMES[name]})[/]" if where == "env" else ""
        console.print(f"{label:<10} {output.escape(value)}{note}")

    line("server", current.url, "url")
    line("user", body["email"] or "", "token")
    line("org", current.org or "(none)", "org")
    line("workspace", current.workspace or "(none)", "workspace")
    orgs = ", ".join(f"{o['slug']} ({o['role']})" for o in body["organizations"])
    console.print(f"[dim]your organisations: {output.escape(orgs or '(none)')}[/]")
    if workspaces:
        names = ", ".join(body["workspaces"])
        console.print(f"[dim]workspaces of {output.escape(current.org)}: {output.escape(names)}[/]")


def _switch(
    client: Client,
    stored: config.StoredConfig,
    current: config.Settings,
    org: str | None,
    workspace: str | None,
) -> None:
    """Check that the organisation and workspace exist for this user (a 404 otherwise) and
    store them."""
    target_org = org or current.org
    if not target_org:
        raise UsageProblem("choose an organisation too: --org ORG")
    client.org_detail(target_org)
    if workspace:
        client.workspace_detail(target_org, workspace)
    elif target_org != current.org:
        workspace = only_workspace(client, target_org)
    else:
        workspace = current.workspace
    stored.org, stored.workspace = target_org, workspace or ""
    config.save(stored)
    for name in ("org", "workspace"):
        if current.sources.get(name) == "env":
            info(f"Note: {config.ENV_NAMES[name]} is set and is used instead of the stored {name}.")
