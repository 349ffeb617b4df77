"""`fleetctl engine list|show|drain|cordon|uncordon|adopt|release`.

`cordon` holds an engine out of traffic while it keeps running (and counting as a replica): the gateways send
it no new request. It waits until every live gateway has applied the change (the routing generation the
controller returned), unless --no-wait. `drain` stops the engine and places a replacement.
`adopt` brings in an engine fleetctl did not launch (an existing vLLM server) after checking it against its
class; `release` drains it through the gateways and lets it go. fleetctl never signals an adopted engine.
"""

from __future__ import annotations

from typing import Annotated

import typer

from fleetctl.cli import direct_cmds
from fleetctl.cli.context import ReasonOption, YesOption, client, confirm, direct
from fleetctl.cli.node_cmd import NoWaitOption, TimeoutOption
from fleetctl.cli.output import DetailOutputOption, Format, OutputOption, emit, status, to_plain
from fleetctl.cli.progress import wait_drained
from fleetctl.cli.status_cmd import ENGINE_COLUMNS
from fleetctl.cli.traffic_cmd import wait_applied
from fleetctl.client import ControllerClient
from fleetctl.controller.responses import EngineChange, EngineView
from fleetctl.errors import NotFound, ValidationFailed

NAME = "engine"
app = typer.Typer(no_args_is_help=True, help="Engines: list, show, drain, cordon, uncordon, adopt, release (direct "
                  "mode: stop, restart).")
GatewayTimeoutOption = Annotated[float, typer.Option("--timeout", min=0, help="seconds to wait for the gateways")]

EngineArg = Annotated[str, typer.Argument(help="engine name (<deployment>-<index>)")]


@app.command("list")
def list_engines(ctx: typer.Context, node: Annotated[str | None, typer.Option("--node", help="only this node")] = None,
                 output: OutputOption = Format.table) -> None:
    """Assigned and reported engines (with --direct: what each agent runs)."""
    fleet = direct(ctx)
    if fleet is not None:
        direct_cmds.show_engines(fleet, output)
        return
    emit(client(ctx).list_engines(node), output, ENGINE_COLUMNS)


@app.command()
def show(ctx: typer.Context, name: EngineArg, output: DetailOutputOption = Format.yaml) -> None:
    """One engine: assignment, reported state, metrics."""
    emit(client(ctx).get_engine(name), output, ENGINE_COLUMNS)


@app.command()
def drain(ctx: typer.Context, name: EngineArg, reason: ReasonOption = None, yes: YesOption = False,
          timeout: TimeoutOption = 300.0, no_wait: NoWaitOption = False) -> None:
    """Drain ENGINE: new requests get 503 + Retry-After, in-flight ones finish, then it stops.
    Its deployment gets a replacement elsewhere. Waits until it stopped unless --no-wait. With --direct the
    agent drains it and holds it drained until the operator adopts or reverts that (`breakglass reconcile`)."""
    confirm(f"Drain engine {name}?", yes)
    fleet = direct(ctx)
    if fleet is not None:
        direct_cmds.engine_action(fleet, name, "drain", reason, Format.table)
        return
    api = client(ctx)
    api.drain_engine(name, reason)
    status(f"engine {name}: draining")
    if not no_wait:
        wait_drained(f"engine {name}", lambda: _still_there(api, name), timeout)


@app.command()
def stop(ctx: typer.Context, name: EngineArg, reason: ReasonOption = None, yes: YesOption = False,
         output: OutputOption = Format.table) -> None:
    """Direct mode only (`fleetctl --direct ...`): the agent stops ENGINE now (SIGTERM; it finishes within
    its grace) and keeps it stopped until the operator adopts or reverts that."""
    fleet = _direct_only(ctx, "engine stop")
    confirm(f"Stop engine {name} now?", yes)
    direct_cmds.engine_action(fleet, name, "stop", reason, output)


@app.command()
def restart(ctx: typer.Context, name: EngineArg, reason: ReasonOption = None, yes: YesOption = False,
            output: OutputOption = Format.table) -> None:
    """Direct mode only: the agent restarts ENGINE's process (and lifts a direct drain or stop)."""
    fleet = _direct_only(ctx, "engine restart")
    confirm(f"Restart engine {name}?", yes)
    direct_cmds.engine_action(fleet, name, "restart", reason, output)


def _direct_only(ctx: typer.Context, command: str) -> direct_cmds.DirectFleet:
    fleet = direct(ctx)
    if fleet is None:
        raise ValidationFailed(f"`fleetctl {command}` is a direct-mode action (fleetctl --direct NODE {command} ...); "
                               "through the controller use `engine drain`", field="direct")
    return fleet


@app.command()
def cordon(ctx: typer.Context, name: EngineArg, reason: ReasonOption = None, yes: YesOption = False,
           timeout: GatewayTimeoutOption = 30.0, no_wait: NoWaitOption = False,
           output: OutputOption = Format.table) -> None:
    """Hold ENGINE out of traffic: it keeps running, the gateways send it no new request. Refused for the
    last routable engine of a revision with traffic. Waits until every live gateway applied it unless --no-wait."""
    confirm(f"Cordon engine {name} (no new requests reach it)?", yes)
    api = client(ctx)
    result = api.cordon_engine(name, reason)
    _report_change(api, result, f"engine {name}: cordoned", timeout, no_wait, output)


@app.command()
def uncordon(ctx: typer.Context, name: EngineArg, reason: ReasonOption = None,
             timeout: GatewayTimeoutOption = 30.0, no_wait: NoWaitOption = False,
             output: OutputOption = Format.table) -> None:
    """Return a cordoned ENGINE to traffic (a drain is not undone)."""
    api = client(ctx)
    result = api.uncordon_engine(name, reason)
    _report_change(api, result, f"engine {name}: in traffic", timeout, no_wait, output)


def _report_change(api: ControllerClient, result: EngineChange, line: str, timeout: float, no_wait: bool,
          output: Format) -> None:
    """The change on stderr; the gateways waited for; with -o json|yaml the engine and what applied it."""
    status(line + (" (already)" if result.result == "unchanged" else f" (routing generation {result.generation})"))
    shown = to_plain(result)
    if not no_wait and result.result == "changed" and result.generation is not None:
        shown["applied"] = wait_applied(api.list_gateways, result.generation, timeout)
    if output is not Format.table:
        emit(shown, output)


def _still_there(api: ControllerClient, name: str) -> list[EngineView]:
    try:
        return [api.get_engine(name)]
    except NotFound:
        return []  # stopped and forgotten


@app.command()
def adopt(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="the engine's base URL, http://HOST:PORT")],
    model: Annotated[str, typer.Option("--model", help="the model name it serves (its /v1/models must list it)")],
    class_ref: Annotated[str, typer.Option("--class", help="the class revision it runs, NAME@rN")],
    role: Annotated[str, typer.Option("--role", help="mixed | prefill | decode")] = "mixed",
    kv_events: Annotated[str | None, typer.Option("--kv-events", help="its KV events publisher, tcp://HOST:PORT "
                                                  "(replay on the next port); without it, no prefix routing")] = None,
    name: Annotated[str | None, typer.Option("--name", help="its name in the fleet [adopted-HOST-PORT]",
                                             show_default=False)] = None,
    reason: ReasonOption = None,
    output: DetailOutputOption = Format.table,
) -> None:
    """Bring in an engine fleetctl did not launch (an existing vLLM server). The controller asks it what it
    serves and runs and refuses it, naming the setting, when that contradicts the class (a different dtype,
    KV dtype, window, RoPE scaling or weights would give other answers). Then the gateways route to it;
    fleetctl never starts, stops or restarts it (`engine release` lets it go)."""
    engine = client(ctx).adopt_engine(url, model, class_ref, role, kv_events, name, reason)
    status(f"engine {engine.name}: adopted ({engine.class_ref}, {engine.state})")
    if output is not Format.table:
        emit(engine, output)


@app.command()
def release(ctx: typer.Context, name: EngineArg, reason: ReasonOption = None, yes: YesOption = False,
            timeout: TimeoutOption = 120.0, no_wait: NoWaitOption = False) -> None:
    """Release an adopted ENGINE: the gateways stop sending it requests at once, and once in-flight ones are
    done it leaves the fleet. It keeps running: fleetctl sends it no signal. Waits unless --no-wait."""
    confirm(f"Release adopted engine {name} (the fleet stops routing to it)?", yes)
    api = client(ctx)
    result = api.release_engine(name, reason)
    status(f"engine {name}: draining through the gateways" + (" (already)" if result.result == "unchanged" else ""))
    if not no_wait:
        wait_drained(f"engine {name}", lambda: _still_there(api, name), timeout)
