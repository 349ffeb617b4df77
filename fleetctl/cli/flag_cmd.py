"""`fleetctl flag list|get|set|unset`: feature flags and kill switches (the catalog: fleetctl/flag_catalog.py,
docs/flags.md).

`set` stores an override with its reason (required) and, with `--ttl`, an expiry after which the flag
reverts to its default by itself. A flag gateways apply (`read_by: gateway`) is waited for as `traffic set`
waits: until every live gateway reports the routing generation that includes the change. A flag the
controller applies takes effect at its next reconcile pass, which the change wakes.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetctl.cli import direct_cmds
from fleetctl.cli.context import ReasonOption, client, direct
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status, to_plain
from fleetctl.cli.traffic_cmd import wait_applied
from fleetctl.errors import ValidationFailed
from fleetctl.flag_catalog import CATALOG, FlagError, key_of, parse_key, parse_ttl

NAME = "flag"
app = typer.Typer(no_args_is_help=True, help="Feature flags and kill switches: list, get, set, unset.")

FlagArg = Annotated[str, typer.Argument(help=f"the flag: {', '.join(sorted(CATALOG))}", show_default=False)]
ModelOption = Annotated[str | None, typer.Option("--model", "-m", help="the model of a per-model flag",
                                                 show_default=False)]
WaitOption = Annotated[bool, typer.Option("--wait/--no-wait", help="wait until every live gateway applied it")]
TimeoutOption = Annotated[float, typer.Option("--timeout", min=0, help="seconds to wait for gateways")]

LIST_COLUMNS = [
    Column("FLAG", lambda r: r["key"]), Column("VALUE", lambda r: shown_value(r["value"])),
    Column("DEFAULT", lambda r: shown_value(r["default"])), Column("OVERRIDE", lambda r: _override(r)),
    Column("READ BY", lambda r: r.get("read_by") or "-"),
]
SET_COLUMNS = [col("FLAG", "name"), Column("VALUE", lambda r: shown_value(r["value"])), col("RESULT", "result"),
               Column("EXPIRES", lambda r: r.get("expires_at") or "-"), col("GENERATION", "generation")]


def shown_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _override(row: dict[str, Any]) -> str:
    if not row.get("overridden"):
        return "-"
    until = f" until {row['expires_at']}" if row.get("expires_at") else ""
    return f"by {row.get('updated_by')}{until}: {row.get('reason') or '(no reason)'}"


def flag_key(name: str, model: str | None) -> str:
    """The key of NAME (or NAME:MODEL, also written `NAME --model MODEL`); ValidationFailed (exit 2) naming
    what is wrong."""
    if ":" in name and model:
        raise ValidationFailed("give the model once: NAME:MODEL or NAME --model MODEL", field="model")
    key = key_of(name, model) if model else name
    try:
        parse_key(key)
    except FlagError as exc:
        raise ValidationFailed(str(exc).removeprefix("name: "), field=exc.field) from None
    return key


@app.command("list")
def list_flags(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """Every flag with its value now, its default and the override in force (owner, reason, expiry)."""
    views = to_plain(client(ctx).list_flags())
    rows = [{"key": key, **view} for key, view in views.items()]
    emit(rows, output, LIST_COLUMNS)


@app.command("get")
def get_flag(ctx: typer.Context, name: FlagArg, model: ModelOption = None, output: OutputOption = Format.table) -> None:
    """One flag: its value now, its default, what it does and its override if any."""
    key = flag_key(name, model)
    view = to_plain(client(ctx).get_flag(key))
    if output is Format.table:
        status(f"{key}: {view['summary']}")
    emit({"key": key, **view}, output, LIST_COLUMNS)


@app.command("set")
def set_flag(
    ctx: typer.Context,
    name: FlagArg,
    value: Annotated[str, typer.Argument(help="true/false, or a number for a numeric flag", show_default=False)],
    model: ModelOption = None,
    ttl: Annotated[str | None, typer.Option("--ttl", help="revert to the default after this long (90s, 30m, 2h, 1d); "
                                            "set again to renew", show_default=False)] = None,
    reason: ReasonOption = None,
    wait: WaitOption = True,
    timeout: TimeoutOption = 30.0,
    output: OutputOption = Format.table,
) -> None:
    """Override a flag, e.g. `fleetctl flag set shed_fraction 0.2 --model chat --ttl 30m --reason overload`.
    With --direct: a local override on each targeted gateway (no --ttl), until adopted or reverted."""
    key = flag_key(name, model)
    require_reason(reason)
    fleet = direct_cmds.direct_targets(ctx, ttl)
    if fleet is not None:
        direct_cmds.set_flag(fleet, key, value, reason, output, f"flag {key}={value}")
        return
    ttl_s = ttl_seconds(ttl)
    api = client(ctx)
    result = api.set_flag(key, value, reason=reason, ttl_s=ttl_s)
    until = f", until {result.expires_at}" if result.expires_at else ""
    status(f"flag {key}: {result.result} ({shown_value(result.value)}{until})")
    shown = applied(api, to_plain(result), key, wait, timeout)
    emit(shown, output, SET_COLUMNS)


@app.command("unset")
def unset_flag(
    ctx: typer.Context,
    name: FlagArg,
    model: ModelOption = None,
    reason: ReasonOption = None,
    wait: WaitOption = True,
    timeout: TimeoutOption = 30.0,
    output: OutputOption = Format.table,
) -> None:
    """Remove a flag's override: it has its default again (with --direct: drop each targeted gateway's local
    override: the controller's value again)."""
    key = flag_key(name, model)
    fleet = direct(ctx)
    if fleet is not None:
        direct_cmds.unset_flag(fleet, key, reason, output, f"flag {key}: local override dropped")
        return
    api = client(ctx)
    result = api.unset_flag(key, reason=reason)
    status(f"flag {key}: {'back to its default' if result.result == 'changed' else 'had no override'} "
           f"({shown_value(result.value)})")
    emit(applied(api, to_plain(result), key, wait, timeout), output, SET_COLUMNS)


def require_reason(reason: str | None) -> str:
    if not reason:
        raise ValidationFailed("--reason is required: say why (it goes into the audit log)", field="reason")
    return reason


def ttl_seconds(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_ttl(text)
    except ValueError as exc:
        raise ValidationFailed(f"--ttl: {exc}", field="ttl") from None


def applied(api: Any, shown: dict[str, Any], key: str, wait: bool, timeout: float) -> dict[str, Any]:
    spec, _model = parse_key(key)
    if spec.read_by == "controller":
        status("the controller applies it at its next reconcile pass")
    elif spec.read_by == "agent":
        status("agents apply it on their next heartbeat")
    elif wait and shown.get("generation") is not None:
        shown["applied"] = wait_applied(api.list_gateways, shown["generation"], timeout)
    return shown
