"""`fleetctl node list|show|cordon|uncordon|drain`."""

from __future__ import annotations

from typing import Annotated

import typer

from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.output import DetailOutputOption, Format, OutputOption, emit, status
from fleetctl.cli.progress import wait_drained
from fleetctl.cli.status_cmd import NODE_COLUMNS

NAME = "node"
app = typer.Typer(no_args_is_help=True, help="Nodes: list, show, cordon, uncordon, drain.")

NodeArg = Annotated[str, typer.Argument(help="node name")]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="seconds to wait for engines to stop")]
NoWaitOption = Annotated[bool, typer.Option("--no-wait", help="return once the drain is recorded")]


@app.command("list")
def list_nodes(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """All nodes."""
    emit(client(ctx).list_nodes(), output, NODE_COLUMNS)


@app.command()
def show(ctx: typer.Context, name: NodeArg, output: DetailOutputOption = Format.yaml) -> None:
    """One node and its engines."""
    emit(client(ctx).get_node(name), output, NODE_COLUMNS)


@app.command()
def cordon(ctx: typer.Context, name: NodeArg, reason: ReasonOption = None, yes: YesOption = False) -> None:
    """No new engines on NODE (running engines stay)."""
    confirm(f"Cordon node {name}?", yes)
    result = client(ctx).cordon_node(name, reason)
    status(f"node {name}: cordoned" + (" (already)" if result.result == "unchanged" else ""))


@app.command()
def uncordon(ctx: typer.Context, name: NodeArg, reason: ReasonOption = None) -> None:
    """Allow new engines on NODE again (ends a drain)."""
    result = client(ctx).uncordon_node(name, reason)
    status(f"node {name}: schedulable" + (" (already)" if result.result == "unchanged" else ""))


@app.command()
def drain(ctx: typer.Context, name: NodeArg, reason: ReasonOption = None, yes: YesOption = False,
          timeout: TimeoutOption = 300.0, no_wait: NoWaitOption = False) -> None:
    """Cordon NODE and drain its engines (the agent stops them after in-flight requests finish);
    replacements are placed on other nodes. Waits until they stopped unless --no-wait."""
    confirm(f"Drain node {name} (its engines stop after finishing in-flight requests)?", yes)
    api = client(ctx)
    api.drain_node(name, reason)
    status(f"node {name}: cordoned, engines draining")
    if not no_wait:
        wait_drained(f"node {name}", lambda: api.list_engines(node=name), timeout)
