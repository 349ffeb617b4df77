"""`fleetctl engine list|show|drain`."""

from __future__ import annotations

from typing import Annotated

import typer

from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.node_cmd import NoWaitOption, TimeoutOption
from fleetctl.cli.output import DetailOutputOption, Format, OutputOption, emit, status
from fleetctl.cli.progress import wait_drained
from fleetctl.cli.status_cmd import ENGINE_COLUMNS
from fleetctl.client import ControllerClient
from fleetctl.controller.responses import EngineView
from fleetctl.errors import NotFound

NAME = "engine"
app = typer.Typer(no_args_is_help=True, help="Engines: list, show, drain.")

EngineArg = Annotated[str, typer.Argument(help="engine name (<deployment>-<index>)")]


@app.command("list")
def list_engines(ctx: typer.Context, node: Annotated[str | None, typer.Option("--node", help="only this node")] = None,
                 output: OutputOption = Format.table) -> None:
    """Assigned and reported engines."""
    emit(client(ctx).list_engines(node), output, ENGINE_COLUMNS)


@app.command()
def show(ctx: typer.Context, name: EngineArg, output: DetailOutputOption = Format.yaml) -> None:
    """One engine: assignment, reported state, metrics."""
    emit(client(ctx).get_engine(name), output, ENGINE_COLUMNS)


@app.command()
def drain(ctx: typer.Context, name: EngineArg, reason: ReasonOption = None, yes: YesOption = False,
          timeout: TimeoutOption = 300.0, no_wait: NoWaitOption = False) -> None:
    """Drain ENGINE: new requests get 503 + Retry-After, in-flight ones finish, then it stops.
    Its deployment gets a replacement elsewhere. Waits until it stopped unless --no-wait."""
    confirm(f"Drain engine {name}?", yes)
    api = client(ctx)
    api.drain_engine(name, reason)
    status(f"engine {name}: draining")
    if not no_wait:
        wait_drained(f"engine {name}", lambda: _still_there(api, name), timeout)


def _still_there(api: ControllerClient, name: str) -> list[EngineView]:
    try:
        return [api.get_engine(name)]
    except NotFound:
        return []  # stopped and forgotten
