"""`fleetctl status`: nodes, engines and deployments in one call (GET /api/v1/status)."""

from __future__ import annotations

from typing import Any

import typer

from fleetctl.cli.context import client
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, table, to_plain

NAME = "status"
app = typer.Typer(invoke_without_command=True, help="Fleet status: nodes, engines, deployments.")

NODE_COLUMNS = [
    col("NODE", "name"), col("STATE", "state"),
    Column("FLAGS", lambda n: ",".join(f for f in ("cordoned", "draining") if n.get(f)) or None),
    Column("HEARTBEAT", lambda n: f"{n['heartbeat_age_s']:g}s ago"),
    Column("ENGINES", lambda n: f"{n['engines']}/{n['capacity']['engines']}"),
    col("LABELS", "labels"),
]
ENGINE_COLUMNS = [
    col("ENGINE", "name"), col("NODE", "node"), col("STATE", "state"), Column("DRAIN", lambda e: e["drain"] or None),
    col("ROLE", "role"), col("CLASS", "class_ref"), col("URL", "url"),
    Column("RUNNING", lambda e: e["metrics"].get("num_requests_running")),
    Column("WAITING", lambda e: e["metrics"].get("num_requests_waiting")),
    Column("KV%", lambda e: _percent(e["metrics"].get("kv_cache_usage_perc"))),
    Column("DRIFT", lambda e: _drift(e.get("drift") or [])),
]
DEPLOYMENT_COLUMNS = [
    col("DEPLOYMENT", "name"), col("MODEL", "model"), col("CLASS", "class_ref"), col("ROLE", "role"),
    Column("READY", lambda d: f"{d['ready']}/{d['replicas']}"), col("PENDING", "pending"),
]


def _drift(drift: list[dict[str, Any]]) -> str | None:
    """The fields a running engine runs differently from its class revision (live drift), or none."""
    return ",".join(dict.fromkeys(d["field"] for d in drift)) or None


def _percent(value: Any) -> str | None:
    return None if value is None else f"{100 * float(value):.0f}"


@app.callback()
def status(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """Nodes (state, heartbeat age, engines), engines (state, role, class, url, load), deployments (ready/desired)."""
    data = client(ctx).status()
    if output is not Format.table:
        emit(data, output)
        return
    leader = "leader" if data.controller.leader else "follower"
    plain = to_plain(data)
    heading = f"controller: {leader}"
    if data.drifted:
        heading += (f"\ndrift: {data.drifted} engine(s) run a config that differs from their class revision "
                    "(fleetctl class diff --live MODEL)")
    sections = [(heading, None, None)] + [
        (title, rows, columns) for title, rows, columns in (
            ("NODES", plain["nodes"], NODE_COLUMNS),
            ("ENGINES", plain["engines"], ENGINE_COLUMNS),
            ("DEPLOYMENTS", plain["deployments"], DEPLOYMENT_COLUMNS),
        )
    ]
    for title, rows, columns in sections:
        if columns is None:
            typer.echo(title)
        elif rows:
            typer.echo("\n" + table(rows, columns))
        else:
            typer.echo(f"\n{title}: none")
