"""`fleetctl breakglass freeze|unfreeze|pin|unpin|shed|kill-switch|status|divergence|reconcile`: the admin's
levers for an incident (controller/breakglass.py, docs/flags.md). Each needs an admin token and `--reason`,
and is audited; each is an override of a catalog flag, so `--ttl` bounds it and `fleetctl status`, the TUI
header and `flag list` show it. A lever gateways apply (pin, shed, a gateway kill switch) is waited for until
every live gateway has it, as `flag set` waits.

With `fleetctl --direct ...`, pin, unpin, shed and kill-switch go to the gateways themselves (no controller:
fleetctl/cli/direct_mode.py). `divergence` lists what was done directly and differs from desired state;
`reconcile` adopts or reverts it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetctl.cli import direct_cmds
from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.flag_cmd import (
    SET_COLUMNS, ModelOption, TimeoutOption, WaitOption, applied, require_reason, shown_value, ttl_seconds,
)
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status, to_plain
from fleetctl.errors import ValidationFailed
from fleetctl.flag_catalog import KILL_SWITCHES

NAME = "breakglass"
app = typer.Typer(no_args_is_help=True, help="Break-glass levers (admin, --reason): freeze, pin, shed, kill-switch.")

TtlOption = Annotated[str | None, typer.Option("--ttl", help="lift it by itself after this long (30m, 2h); "
                                               "none: until lifted", show_default=False)]
ModelArg = Annotated[str, typer.Argument(help="the model", show_default=False)]

STATUS_COLUMNS = [Column("HOLD", lambda r: r["hold"]), Column("VALUE", lambda r: shown_value(r["value"])),
                  Column("BY", lambda r: r.get("updated_by") or "-"),
                  Column("UNTIL", lambda r: r.get("expires_at") or "-"),
                  Column("REASON", lambda r: r.get("reason") or "-")]


def _done(api: Any, result: Any, key: str, line: str, wait: bool, timeout: float, output: Format) -> None:
    status(line)
    emit(applied(api, to_plain(result), key, wait, timeout), output, SET_COLUMNS)


@app.command("freeze")
def freeze(ctx: typer.Context, reason: ReasonOption = None, ttl: TtlOption = None,
           output: OutputOption = Format.table) -> None:
    """Stop the reconciler and every rollout from changing the fleet (rollouts show paused_by: freeze);
    serving goes on. `unfreeze` lifts it."""
    api = client(ctx)
    result = api.freeze(reason=require_reason(reason), ttl_s=ttl_seconds(ttl))
    _done(api, result, "freeze", f"fleet frozen ({result.result}): the reconciler and rollouts change nothing"
          + (f" until {result.expires_at}" if result.expires_at else ""), False, 0, output)


@app.command("unfreeze")
def unfreeze(ctx: typer.Context, reason: ReasonOption = None, output: OutputOption = Format.table) -> None:
    """Lift the freeze: the reconciler and the held rollouts go on from where they were."""
    api = client(ctx)
    result = api.unfreeze(reason=require_reason(reason))
    _done(api, result, "freeze", "fleet unfrozen" if result.result == "changed" else "the fleet was not frozen",
          False, 0, output)


@app.command("pin")
def pin(ctx: typer.Context, model: ModelArg,
        class_ref: Annotated[str, typer.Argument(help="the known-good class revision, NAME@rN", show_default=False)],
        reason: ReasonOption = None, ttl: TtlOption = None, yes: YesOption = False, wait: WaitOption = True,
        timeout: TimeoutOption = 30.0, output: OutputOption = Format.table) -> None:
    """Send all of MODEL's traffic to CLASS_REF, over its weights, drills and rollouts (which hold), until
    `unpin`. Refused unless CLASS_REF is deployed for MODEL with a ready engine."""
    why = require_reason(reason)
    confirm(f"Send all of {model}'s traffic to {class_ref}?", yes)
    fleet = direct_cmds.direct_targets(ctx, ttl)
    if fleet is not None:
        direct_cmds.set_flag(fleet, f"pin:{model}", class_ref, why, output, f"{model} pinned to {class_ref}")
        return
    api = client(ctx)
    result = api.pin_model(model, class_ref, reason=why, ttl_s=ttl_seconds(ttl))
    _done(api, result, f"pin:{model}", f"{model} pinned to {class_ref} ({result.result})", wait, timeout, output)


@app.command("unpin")
def unpin(ctx: typer.Context, model: ModelArg, reason: ReasonOption = None, wait: WaitOption = True,
          timeout: TimeoutOption = 30.0, output: OutputOption = Format.table) -> None:
    """Lift MODEL's pin: its weights decide again and its rollouts go on."""
    fleet = direct_cmds.direct_targets(ctx, None)
    if fleet is not None:
        direct_cmds.unset_flag(fleet, f"pin:{model}", require_reason(reason), output, f"{model}: local pin dropped")
        return
    api = client(ctx)
    result = api.unpin_model(model, reason=require_reason(reason))
    _done(api, result, f"pin:{model}", f"{model} unpinned" if result.result == "changed" else f"{model} was not pinned",
          wait, timeout, output)


@app.command("shed")
def shed(ctx: typer.Context, model: ModelArg,
         fraction: Annotated[float, typer.Option("--fraction", "-f", min=0, max=1, help="share of MODEL's requests "
                                                 "to answer 429 at once (0 stops shedding)")],
         reason: ReasonOption = None, ttl: TtlOption = None, yes: YesOption = False, wait: WaitOption = True,
         timeout: TimeoutOption = 30.0, output: OutputOption = Format.table) -> None:
    """Reject FRACTION of MODEL's requests at the gateways with 429 and Retry-After, before any engine work."""
    why = require_reason(reason)
    if fraction > 0:
        confirm(f"Reject {fraction:.0%} of {model}'s requests with 429?", yes)
    fleet = direct_cmds.direct_targets(ctx, ttl)
    if fleet is not None:
        key = f"shed_fraction:{model}"
        if fraction > 0:
            direct_cmds.set_flag(fleet, key, fraction, why, output, f"{model}: shedding {fraction:.0%}")
        else:
            direct_cmds.unset_flag(fleet, key, why, output, f"{model}: local shedding dropped")
        return
    api = client(ctx)
    result = api.shed_model(model, fraction, reason=why, ttl_s=ttl_seconds(ttl))
    line = f"{model}: shedding {fraction:.0%}" if fraction > 0 else f"{model}: not shedding"
    _done(api, result, f"shed_fraction:{model}", line, wait, timeout, output)


@app.command("kill-switch")
def kill_switch(ctx: typer.Context,
                flag: Annotated[str, typer.Argument(help=f"one of: {', '.join(KILL_SWITCHES)}", show_default=False)],
                model: ModelOption = None, reason: ReasonOption = None, ttl: TtlOption = None,
                yes: YesOption = False, wait: WaitOption = True, timeout: TimeoutOption = 30.0,
                output: OutputOption = Format.table) -> None:
    """Turn a default-on flag off now (`fleetctl flag unset FLAG` turns it back on)."""
    why = require_reason(reason)
    confirm(f"Turn {flag}{' for ' + model if model else ''} off?", yes)
    fleet = direct_cmds.direct_targets(ctx, ttl)
    if fleet is not None:
        key = f"{flag}:{model}" if model else flag
        direct_cmds.set_flag(fleet, key, False, why, output, f"{key}: off")
        return
    api = client(ctx)
    result = api.kill_switch(flag, model=model, reason=why, ttl_s=ttl_seconds(ttl))
    _done(api, result, result.name, f"{result.name}: off ({result.result}); `fleetctl flag unset {flag}"
          f"{' --model ' + model if model else ''}` turns it back on", wait, timeout, output)


@app.command("status")
def holds(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """Every break-glass hold in force: the freeze, pins, shedding, and kill switches off."""
    flags = to_plain(client(ctx).list_flags())
    rows = [{"hold": key, **view} for key, view in flags.items() if view.get("overridden") and _is_hold(key, view)]
    if output is Format.table and not rows:
        status("no break-glass hold in force")
    emit(rows, output, STATUS_COLUMNS)


def _is_hold(key: str, view: dict[str, Any]) -> bool:
    name = key.partition(":")[0]
    return name in ("freeze", "pin") or (name == "shed_fraction" and bool(view.get("value"))) \
        or (name in KILL_SWITCHES and view.get("value") is False)


DIVERGENCE_COLUMNS = [
    col("ID", "id"), Column("SOURCE", lambda r: f"{r['kind']} {r['source']}"), col("AT", "at"),
    Column("DID", lambda r: f"{r['action']} {r['target']}" + (f"={shown_value(r['value'])}" if r.get("value") is not None else "")),
    Column("DESIRED", lambda r: shown_value(r.get("desired"))), col("STATE", "state"),
    Column("REASON", lambda r: r.get("reason") or "-"),
]
IdsOption = Annotated[list[int] | None, typer.Option(help="a direct action's ID (repeat for more)", show_default=False)]


@app.command("divergence")
def divergence(ctx: typer.Context,
               all_actions: Annotated[bool, typer.Option("--all", help="every uploaded direct action, resolved too")] = False,
               output: OutputOption = Format.table) -> None:
    """What agents and gateways did directly (on their break-glass credentials, without the controller) that
    desired state does not agree with: each is kept, not undone, until `reconcile` adopts or reverts it."""
    rows = to_plain(client(ctx).divergence(all=all_actions))
    if output is Format.table and not rows:
        status("no direct action diverges from desired state" if not all_actions else "no direct action uploaded")
    emit(rows, output, DIVERGENCE_COLUMNS)


@app.command("reconcile")
def reconcile(ctx: typer.Context, adopt: IdsOption = None, revert: IdsOption = None,
              adopt_all: Annotated[bool, typer.Option("--adopt-all", help="adopt every divergence")] = False,
              revert_all: Annotated[bool, typer.Option("--revert-all", help="revert every divergence")] = False,
              reason: ReasonOption = None, yes: YesOption = False, output: OutputOption = Format.table) -> None:
    """Settle what was done directly: adopt a divergence (desired state takes it over: the flag is set
    centrally, the engine drained by the controller) or revert it (the node undoes it). Without --adopt or
    --revert, asks about each divergence in turn."""
    why = require_reason(reason)
    api = client(ctx)
    pending = to_plain(api.divergence())
    if adopt_all and revert_all:
        raise ValidationFailed("--revert-all: not with --adopt-all", field="revert_all")
    adopt_ids = [r["id"] for r in pending] if adopt_all else list(adopt or [])
    revert_ids = [r["id"] for r in pending] if revert_all else list(revert or [])
    if not adopt_ids and not revert_ids:
        if not pending:
            status("no direct action diverges from desired state: nothing to reconcile")
            emit({"adopted": [], "reverted": []}, output, RECONCILE_COLUMNS)
            return
        adopt_ids, revert_ids = _ask_each(pending, yes)
    elif not yes:
        confirm(f"Adopt {len(adopt_ids)} and revert {len(revert_ids)} direct action(s)?", yes)
    if not adopt_ids and not revert_ids:
        status("nothing chosen: nothing changed")
        return
    result = api.reconcile(adopt=adopt_ids, revert=revert_ids, reason=why)
    status(f"adopted {len(result.adopted)}, reverted {len(result.reverted)}: each node learns at its next upload")
    emit(result, output, RECONCILE_COLUMNS)


RECONCILE_COLUMNS = [Column("ADOPTED", lambda r: ",".join(map(str, r["adopted"])) or "-"),
                     Column("REVERTED", lambda r: ",".join(map(str, r["reverted"])) or "-")]


def _ask_each(pending: list[dict[str, Any]], yes: bool) -> tuple[list[int], list[int]]:
    if yes:
        raise ValidationFailed("--yes: say what to do (--adopt ID, --revert ID, --adopt-all or --revert-all)",
                               field="adopt")
    adopt, revert = [], []
    for row in pending:
        typer.echo(f"[{row['id']}] {row['kind']} {row['source']} did {row['action']} {row['target']}"
                   f"{'=' + shown_value(row['value']) if row.get('value') is not None else ''} at {row['at']}"
                   f" ({row.get('reason') or 'no reason given'}); desired: {shown_value(row.get('desired'))}", err=True)
        typer.echo(f"    adopt: {row['adopt']}\n    revert: {row['revert']}", err=True)
        choice = typer.prompt("    adopt, revert or skip?", default="skip", err=True).strip().lower()
        if choice.startswith("a"):
            adopt.append(row["id"])
        elif choice.startswith("r"):
            revert.append(row["id"])
    return adopt, revert
