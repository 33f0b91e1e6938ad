"""The ``manta`` command: log in, choose a workspace, submit and follow jobs.

Exit codes: 0 done (a followed job succeeded); 1 a followed job did not succeed, or the API or
the network said no; 2 bad input (a usage error, or the API answered 400); 130 Ctrl-C.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from . import config, output
from .commands import account, jobs, submit
from .commands.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    NotSupportedByServer,
    UsageProblem,
    state_of,
)
from .errors import ApiError, ConnectionFailed
from .output import OutputFormat


class MantaGroup(TyperGroup):
    """Turns the SDK's errors into messages on stderr and the CLI's exit codes."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ApiError as exc:
            output.print_api_error(exc, as_json=state_of(ctx).as_json)
            raise typer.Exit(EXIT_BAD_INPUT if exc.status == 400 else EXIT_FAILED) from exc
        except UsageProblem as exc:
            output.print_error(str(exc), as_json=state_of(ctx).as_json)
            raise typer.Exit(EXIT_BAD_INPUT) from exc
        except (ConnectionFailed, NotSupportedByServer, config.ConfigError) as exc:
            output.print_error(str(exc), as_json=state_of(ctx).as_json)
            raise typer.Exit(EXIT_FAILED) from exc


app = typer.Typer(
    cls=MantaGroup,
    name="manta",
    help="Submit and follow Ray jobs on Manta.",
    no_args_is_help=True,
    # A traceback with locals would print the token.
    pretty_exceptions_enable=False,
)


@app.callback()
def main(
    ctx: typer.Context,
    output_format: Annotated[
        OutputFormat,
        typer.Option("--output", "-o", help="table for people, json for scripts"),
    ] = OutputFormat.table,
) -> None:
    """Manta: governed Ray jobs. Start with `manta login`, then `manta context`."""
    state_of(ctx).output = output_format


app.command("login")(account.login)
app.command("logout")(account.logout)
app.command("context")(account.context)
app.command("submit", context_settings={"allow_interspersed_args": False})(submit.submit)
app.add_typer(jobs.jobs_app, name="jobs")
app.add_typer(jobs.templates_app, name="templates")
app.add_typer(jobs.sources_app, name="sources")
app.command("quota")(jobs.quota)
