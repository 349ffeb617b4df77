"""`fleetctl tui`: the live fleet view (ui/app.py), on the controller and token of the global options
(`fleetctl --controller URL --token T tui`) or `--controller` here. `--readonly` turns off every key that
changes the fleet; a viewer token does the same by itself. The TUI is imported inside the command, so no
other command loads Textual."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from fleetctl.cli.context import cli, local_token
from fleetctl.cli.exit_codes import ExitCode

NAME = "tui"
app = typer.Typer(invoke_without_command=True, help="Live fleet view in the terminal (k9s style).")


@app.callback()
def tui(
    ctx: typer.Context,
    controller: Annotated[str | None, typer.Option(
        "--controller", show_default=False, help="controller URL [default: the global --controller]")] = None,
    readonly: Annotated[bool, typer.Option("--readonly", help="show the fleet; change nothing")] = False,
) -> None:
    """The fleet, rollouts, quality, traffic and events, live from the controller's change stream."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        typer.echo("error: fleetctl tui needs a terminal (for scripts: fleetctl status -o json)", err=True)
        raise typer.Exit(int(ExitCode.USAGE))
    from ui.app import make_app

    options = cli(ctx)
    make_app(controller or options.controller, options.token or local_token(), readonly).run()
