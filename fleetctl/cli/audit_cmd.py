"""`fleetctl audit list`: the append-only audit log."""

from __future__ import annotations

from typing import Annotated

import typer

from fleetctl.cli.context import client
from fleetctl.cli.output import Column, Format, OutputOption, col, emit

NAME = "audit"
app = typer.Typer(no_args_is_help=True, help="The audit log of every change (and refused attempt).")

COLUMNS = [
    col("TIME", "at"), col("ACTOR", "actor"), col("ACTION", "action"), col("TARGET", "target"),
    Column("RESULT", lambda e: e["result"] + (f" ({e['code']})" if e.get("code") else "")), col("REASON", "reason"),
]


@app.command("list")
def list_events(
    ctx: typer.Context,
    since: Annotated[str | None, typer.Option("--since", help="a duration ago (15m, 2h, 7d) or an ISO time")] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="only this token name")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many (the newest)")] = 1000,
    output: OutputOption = Format.table,
) -> None:
    """Audit events, oldest first."""
    emit(client(ctx).list_audit(since, actor, limit), output, COLUMNS)
