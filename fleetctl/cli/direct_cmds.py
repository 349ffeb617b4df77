"""What the direct-mode commands print (fleetctl/cli/direct_mode.py does the calls): `status`, `engine ...`,
`flag set|unset` and the break-glass levers, when `--direct` is given."""

from __future__ import annotations

from typing import Any

import typer

from fleetctl.cli.context import direct
from fleetctl.cli.direct_mode import DirectFleet
from fleetctl.cli.output import Column, Format, col, emit, status
from fleetctl.flag_catalog import FlagError, coerce, parse_key
from fleetctl.errors import ValidationFailed

STATUS_COLUMNS = [
    col("NAME", "name"), col("KIND", "kind"), col("URL", "url"),
    Column("UP", lambda r: "yes" if r.get("reachable") else "NO"),
    Column("STATE", lambda r: _state(r)),
    Column("UNUPLOADED", lambda r: r.get("unuploaded", "-")),
]
ENGINE_COLUMNS = [col("NODE", "node"), col("NAME", "name"), col("STATE", "state"), col("CLASS", "class_ref"),
                  col("URL", "url")]
ACTION_COLUMNS = [col("NODE", "node"), col("ENGINE", "engine"), col("ACTION", "action"), col("SEQ", "seq")]
FLAG_COLUMNS = [col("GATEWAY", "name"), col("KEY", "key"), Column("VALUE", lambda r: _shown(r.get("value"))),
                Column("LOCAL", lambda r: "yes" if r.get("local") else "no"), col("SEQ", "seq")]


def _state(row: dict[str, Any]) -> str:
    if not row.get("reachable"):
        return row.get("error", "-")
    if row["kind"] == "agent":
        engines = ", ".join(f"{n}={s}" for n, s in row["engines"].items()) or "no engines"
        held = f"; held: {', '.join(row['holds'])}" if row.get("holds") else ""
        return f"controller {row['controller']}; {engines}{held}"
    local = ", ".join(f"{k}={_shown(v['value'])}" for k, v in row["local"].items()) or "none"
    return f"generation {row['generation']}; local overrides: {local}"


def _shown(value: Any) -> str:
    return "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def direct_targets(ctx: typer.Context, ttl: str | None) -> DirectFleet | None:
    """The --direct targets (None without --direct), refusing `--ttl`: a direct override holds until it is
    adopted or reverted."""
    fleet = direct(ctx)
    if fleet is not None and ttl is not None:
        raise ValidationFailed("--ttl: a direct override holds until adopted or reverted", field="ttl")
    return fleet


def show_status(fleet: DirectFleet, output: Format) -> None:
    rows = fleet.status()
    if output is Format.table:
        status(f"direct mode: {len(rows)} target(s), the controller is not asked")
    emit(rows, output, STATUS_COLUMNS)


def show_engines(fleet: DirectFleet, output: Format) -> None:
    emit(fleet.engines(), output, ENGINE_COLUMNS)


def engine_action(fleet: DirectFleet, name: str, action: str, reason: str | None, output: Format) -> None:
    result = fleet.engine_action(name, action, reason)
    status(f"engine {name} on {result['node']}: {action} (direct, journal entry {result['seq']}); "
           "the controller will ask to adopt or revert it")
    emit(result, output, ACTION_COLUMNS)


def set_flag(fleet: DirectFleet, key: str, value: Any, reason: str | None, output: Format, line: str) -> None:
    try:
        typed = coerce(parse_key(key)[0], value)
    except FlagError as exc:
        raise ValidationFailed(str(exc), field=exc.field or "value") from None
    results = fleet.set_flag(key, typed, reason)
    status(f"{line} on {len(results)} gateway(s) (direct: a local override until adopted or reverted)")
    emit(results, output, FLAG_COLUMNS)


def unset_flag(fleet: DirectFleet, key: str, reason: str | None, output: Format, line: str) -> None:
    results = fleet.unset_flag(key, reason)
    status(f"{line} on {len(results)} gateway(s) (direct)")
    emit(results, output, FLAG_COLUMNS)
