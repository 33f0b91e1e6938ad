"""What every command shares: the invocation's state, the exit codes, the client from the
stored login and the environment, and the errors that stop a command."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated

import typer

from .. import config, output
from ..client import Client
from ..output import OutputFormat
from ..terminal import escape_controls

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
DEFAULT_POLL_SECONDS = 1.0

OutputOption = Annotated[
    OutputFormat | None,
    typer.Option("--output", "-o", help="table for people, json for scripts"),
]


RawOption = Annotated[
    bool,
    typer.Option(
        "--raw",
        help="Print the job's log exactly as the job wrote it. Without it, control characters in "
        "the log (escape sequences, a carriage return that does not end a line, NUL, DEL, C1 "
        "controls) are shown escaped, as \\x1b, whether or not the output is a terminal (a log "
        "saved to a file and shown later is as dangerous), so a job cannot move the cursor, "
        "clear the screen, retitle the window or write the clipboard.",
    ),
]


class UsageProblem(Exception):
    """The command cannot run as asked (exit 2): nothing chosen, a name that does not exist."""


class NotSupportedByServer(Exception):
    """The server is older than what the command needs (exit 1)."""


@dataclass
class State:
    output: OutputFormat = OutputFormat.table

    @property
    def as_json(self) -> bool:
        return self.output == OutputFormat.json


def state_of(ctx: typer.Context) -> State:
    root = ctx.find_root()
    if not isinstance(root.obj, State):
        root.obj = State()
    return root.obj


def use(ctx: typer.Context, output_format: OutputFormat | None) -> State:
    """The invocation's state, with a command's own ``--output`` over the global one."""
    state = state_of(ctx)
    if output_format is not None:
        state.output = output_format
    return state


def settings() -> config.Settings:
    return config.resolve(config.load())


def require_login(current: config.Settings) -> None:
    if not current.url or not current.token:
        raise UsageProblem("not logged in: run `manta login` (or set MANTA_URL and MANTA_TOKEN)")


def client(*, workspace: bool = True) -> Client:
    """A client for the stored login, the environment over it; with ``workspace``, one that
    knows its organisation and workspace."""
    current = settings()
    require_login(current)
    if workspace and not (current.org and current.workspace):
        raise UsageProblem(
            "no workspace chosen: run `manta context --org ORG --workspace WORKSPACE` "
            "(or set MANTA_ORG and MANTA_WORKSPACE)"
        )
    return Client(
        current.url, current.token, org=current.org or None, workspace=current.workspace or None
    )


def info(message: str) -> None:
    """Progress for people: on stderr, so stdout stays the command's result. It may quote the
    server (a job's name, how it ended): control characters are escaped."""
    output.stderr().print(escape_controls(message), markup=False)


def poll_seconds() -> float:
    """How often a follower asks (``MANTA_POLL_SECONDS``, default 1)."""
    try:
        return max(0.05, float(os.environ.get("MANTA_POLL_SECONDS", DEFAULT_POLL_SECONDS)))
    except ValueError:
        return DEFAULT_POLL_SECONDS
