"""`fleetctl class diff --live MODEL`: each running engine of MODEL against its class revision.

What the engine side reports (the command line its agent launched, the engine's own settings) is compared
with the class revision by the controller (GET /api/v1/drift; fleetctl/controller/drift.py). Exit 0 when no
engine differs, `ExitCode.DIFFERS` (7) when one does, so a script can gate on it.
"""

from __future__ import annotations

from typing import Any

import typer

from fleetctl.cli.context import client
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.output import Column, Format, col, emit, status, table, to_plain

ENGINE_COLUMNS = [
    col("ENGINE", "name"), col("NODE", "node"), col("CLASS", "class_ref"), col("STATE", "state"),
    Column("CHECKED", lambda e: ",".join(e["checked"]) or "nothing reported"),
    Column("DRIFT", lambda e: len(e["drift"]) if e["drifted"] else "no"),
]


def live_diff(ctx: typer.Context, model: str, output: Format) -> None:
    """Print every running engine of `model` with its differences; exit 7 when any engine drifted."""
    engines = to_plain(client(ctx).live_drift(model))
    if output is Format.table:
        _print_table(engines)
    else:
        emit(engines, output)
    drifted = [e["name"] for e in engines if e["drifted"]]
    status(summary(model, engines, drifted))
    if drifted:
        raise typer.Exit(int(ExitCode.DIFFERS))


def summary(model: str, engines: list[dict[str, Any]], drifted: list[str]) -> str:
    if not engines:
        return f"model {model}: no running engines to compare"
    if not drifted:
        return f"model {model}: all {len(engines)} running engine(s) run their class revision"
    return f"model {model}: {len(drifted)} of {len(engines)} running engine(s) differ from their class revision: " \
           + ", ".join(drifted)


def _print_table(engines: list[dict[str, Any]]) -> None:
    if not engines:
        return
    typer.echo(table(engines, ENGINE_COLUMNS))
    for engine in engines:
        if engine["drift"]:
            typer.echo(f"\n{engine['name']} ({engine['class_ref']}):")
            typer.echo(format_drift(engine["drift"]))


def format_drift(drift: list[dict[str, Any]]) -> str:
    return "\n".join(f"  {d['field']}: declared {d['declared']!r}, runs {d['actual']!r}  ({d['source']})"
                     for d in drift)
