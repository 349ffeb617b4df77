"""`fleetctl drill misroute|plant|stop|list`: canary drills, time-bound and audited (docs/drills.md).

- `misroute --model M --to NAME@rN --fraction 0.15 --duration 20m`: gateways send that fraction of M's
  traffic to the revision for that long; the stored traffic policy is not changed.
- `plant --engine E --fault F --duration 20m`: the engine is restarted with a hidden numeric fault that its
  reported configuration does not show, and restarted clean when the drill ends.
- `stop ID` or `stop --all`: end drills now. `list`: the drills in effect, then the last 50 that ended.

Starting a drill changes what production users get, so `misroute` and `plant` ask first (unless --yes), as
`traffic set` does. Durations read like the rollout spec's (30s, 20m, 1h, or seconds); the controller
holds the bounds (fraction at most 0.5, duration at most 4h) and refuses, naming the field, outside them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from engine.contract.faults import FAULTS
from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status
from fleetctl.cli.traffic_cmd import wait_applied
from fleetctl.controller.responses import DrillStarted
from fleetctl.errors import ValidationFailed

NAME = "drill"
app = typer.Typer(no_args_is_help=True, help="Canary drills: misroute traffic or plant a fault, for a while.")

DurationOption = Annotated[str, typer.Option("--duration", help="how long it lasts: 30s, 20m, 1h or seconds (at most 4h)")]
WaitOption = Annotated[bool, typer.Option("--wait/--no-wait", help="wait until every live gateway routes on it")]
TimeoutOption = Annotated[float, typer.Option("--timeout", min=0, help="seconds to wait for gateways")]

COLUMNS = [
    col("ID", "id"), col("KIND", "kind"), col("MODEL", "model"),
    Column("TARGET", lambda d: d["to_ref"] if d["kind"] == "misroute" else d["engine"]),
    Column("WHAT", lambda d: f"{d['fraction'] * 100:g}%" if d["kind"] == "misroute" else d["fault"]),
    Column("STATE", lambda d: "active" if d["active"] else f"ended ({d['stopped_by']})"),
    Column("ENDS", lambda d: d["ends_at"] if d["active"] else d["stopped_at"]),
    Column("LEFT", lambda d: f"{d['remaining_s']:g}s" if d["remaining_s"] is not None else None),
    col("BY", "created_by"),
]
STOP_COLUMNS = [col("ID", "id"), col("KIND", "kind"), col("MODEL", "model"), col("DRILL", "description")]


def parse_duration_option(value: str) -> float:
    """'20m' -> 1200.0; ValidationFailed (exit 2) naming --duration otherwise."""
    from fleetctl.controller.rollout.spec import parse_duration  # lazily: pydantic models, as traffic_cmd does

    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ValidationFailed(f"--duration: {exc}", field="duration") from None
    if seconds <= 0:
        raise ValidationFailed(f"--duration: {value!r} must be more than 0", field="duration")
    return seconds


def check_ref(value: str) -> str:
    from fleetctl.replica_class import parse_ref  # lazily, as traffic_cmd does

    try:
        parse_ref(value)
    except ValueError as exc:
        raise ValidationFailed(f"--to: {exc}", field="to") from None
    return value


def check_fault(value: str) -> str:
    if value not in FAULTS:
        raise ValidationFailed(f"--fault: {value!r} is not a planted fault; one of {', '.join(sorted(FAULTS))}",
                               field="fault")
    return value


def _span(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 else f"{seconds:g}s"


def _started(view: DrillStarted, output: Format) -> None:
    status(f"{view.description} started; it ends at {view.ends_at} (stop it sooner: fleetctl drill stop {view.id})")
    emit(view, output, COLUMNS)


# --- commands ---

@app.command("misroute")
def misroute(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="the model whose traffic is misrouted", show_default=False)],
    to: Annotated[str, typer.Option("--to", help="the class revision NAME@rN that gets the fraction", show_default=False)],
    fraction: Annotated[float, typer.Option("--fraction", help="the share of the traffic sent there, e.g. 0.15 "
                                                               "(more than 0, at most 0.5)", show_default=False)],
    duration: DurationOption = "20m",
    reason: ReasonOption = None,
    wait: WaitOption = False,
    timeout: TimeoutOption = 30.0,
    yes: YesOption = False,
    output: OutputOption = Format.table,
) -> None:
    """Send --fraction of --model's traffic to --to for --duration (asks first unless --yes)."""
    seconds = parse_duration_option(duration)
    check_ref(to)
    confirm(f"Send {fraction * 100:g}% of {model}'s production traffic to {to} for {_span(seconds)}? "
            "Users get that revision's answers. This is audited.", yes)
    api = client(ctx)
    view = api.start_misroute_drill(model, to, fraction, seconds, reason)
    _started(view, output)
    if wait:
        wait_applied(api.list_gateways, view.generation, timeout)


@app.command("plant")
def plant(
    ctx: typer.Context,
    engine: Annotated[str, typer.Option("--engine", help="the running engine restarted with the fault", show_default=False)],
    fault: Annotated[str, typer.Option("--fault", help=f"one of: {', '.join(sorted(FAULTS))}", show_default=False)],
    duration: DurationOption = "20m",
    reason: ReasonOption = None,
    yes: YesOption = False,
    output: OutputOption = Format.table,
) -> None:
    """Restart --engine with a hidden --fault for --duration, then restart it clean (asks first unless --yes)."""
    seconds = parse_duration_option(duration)
    check_fault(fault)
    confirm(f"Restart engine {engine} with the hidden fault {fault} ({FAULTS[fault]}) for {_span(seconds)}? "
            "The requests it serves get wrong answers. This is audited.", yes)
    _started(client(ctx).start_plant_drill(engine, fault, seconds, reason), output)


@app.command("stop")
def stop(
    ctx: typer.Context,
    drill_id: Annotated[int | None, typer.Argument(metavar="ID", help="the drill to end", show_default=False)] = None,
    all_: Annotated[bool, typer.Option("--all", help="end every drill in effect")] = False,
    reason: ReasonOption = None,
    output: OutputOption = Format.table,
) -> None:
    """End drill ID, or every drill with --all: traffic and engines are as before the drill."""
    if (drill_id is None) == (not all_):
        raise ValidationFailed("give a drill ID or --all (one of them)", field="id")
    api = client(ctx)
    result = api.stop_all_drills(reason) if all_ else api.stop_drill(drill_id, reason)
    if result.result == "unchanged":
        status("no drill was in effect; nothing stopped" if all_ else f"drill {drill_id} had ended already")
    for view in result.stopped:
        status(f"stopped {view.description}")
    emit(result.stopped, output, STOP_COLUMNS)


@app.command("list")
def list_drills(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """The drills in effect, then the last 50 that ended."""
    emit(client(ctx).list_drills(), output, COLUMNS)
