"""`fleetctl status`: nodes, engines, deployments and gateways in one call (GET /api/v1/status); with `--watch`,
kept live from the controller's change stream (status_watch.py)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetctl.cli.context import client, direct
from fleetctl.cli.direct_cmds import show_status as show_direct_status
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, table, to_plain
from fleetctl.errors import ValidationFailed

NAME = "status"
app = typer.Typer(invoke_without_command=True, help="Fleet status: nodes, engines, deployments, gateways.")

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
    Column("HASHES", lambda e: "mismatch" if e.get("hash_mismatch") else None),
    Column("DRIFT", lambda e: _drift(e.get("drift") or [])),
]
DEPLOYMENT_COLUMNS = [
    col("DEPLOYMENT", "name"), col("MODEL", "model"), col("CLASS", "class_ref"), col("ROLE", "role"),
    Column("READY", lambda d: f"{d['ready']}/{d['replicas']}"), col("PENDING", "pending"),
]
GATEWAY_COLUMNS = [
    col("GATEWAY", "name"), col("URL", "url"), Column("TABLE AGE", lambda g: f"{g['table_age_s']:g}s"),
    col("GENERATION", "generation"), Column("HEALTH", lambda g: "stale" if g["stale"] else "live"),
    Column("SEEN", lambda g: f"{g['seen_ago_s']:g}s ago"),
]


def _drift(drift: list[dict[str, Any]]) -> str | None:
    """The fields a running engine runs differently from its class revision (live drift), or none."""
    return ",".join(dict.fromkeys(d["field"] for d in drift)) or None


def _percent(value: Any) -> str | None:
    return None if value is None else f"{100 * float(value):.0f}"


@app.callback()
def status(
    ctx: typer.Context,
    output: OutputOption = Format.table,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="keep the view live from the controller's change "
                                        "stream (redrawn on change, at most once a second); Ctrl-C ends it")] = False,
    max_updates: Annotated[int | None, typer.Option("--max-updates", min=1, show_default=False,
                                                    help="with --watch: stop after this many redraws")] = None,
) -> None:
    """Nodes (state, heartbeat age, engines), engines (state, role, class, url, load), deployments (ready/desired),
    gateways (routing-table generation and age, live or stale). With --direct: each target's own account."""
    fleet = direct(ctx)
    if fleet is not None:
        if watch:
            raise ValidationFailed("--watch: the change stream is the controller's; not in direct mode", field="watch")
        show_direct_status(fleet, output)
        return
    if watch:
        from fleetctl.cli.status_watch import watch_status

        raise typer.Exit(watch_status(client(ctx), output, max_updates))
    if max_updates is not None:
        raise ValidationFailed("--max-updates: only with --watch", field="max_updates")
    data = client(ctx).status()
    if output is not Format.table:
        emit(data, output)
        return
    plain = to_plain(data)
    heading = (f"controller: {'leader' if data.controller.leader else 'follower'}"
               + break_glass_lines(plain.get("break_glass")) + drift_line(data.drifted))
    typer.echo(render(heading, [("NODES", plain["nodes"], NODE_COLUMNS), ("ENGINES", plain["engines"], ENGINE_COLUMNS),
                                ("DEPLOYMENTS", plain["deployments"], DEPLOYMENT_COLUMNS),
                                ("GATEWAYS", plain.get("gateways") or [], GATEWAY_COLUMNS)]))


Section = tuple[str, list[dict[str, Any]], list[Column]]


def render(heading: str, sections: list[Section]) -> str:
    """The heading, then each section's table (or "TITLE: none"), a blank line apart."""
    parts = [heading]
    for title, rows, columns in sections:
        parts.append(table(rows, columns) if rows else f"{title}: none")
    return "\n\n".join(parts)


def break_glass_lines(holds: dict[str, Any] | None) -> str:
    """A line for a freeze and one per pinned model: who, why, until when, and how to lift it."""
    if not holds:
        return ""
    lines = [freeze_line(holds.get("freeze"))] if holds.get("frozen") else []
    lines += [pin_line(model, pin["value"], pin) for model, pin in sorted((holds.get("pins") or {}).items())]
    return "".join(f"\n{line}" for line in lines)


def freeze_line(view: dict[str, Any] | None = None) -> str:
    return f"FROZEN: the reconciler and rollouts change nothing{_held_by(view)} (fleetctl breakglass unfreeze)"


def pin_line(model: str, ref: str, view: dict[str, Any] | None = None) -> str:
    return f"PINNED: all of {model}'s traffic goes to {ref}{_held_by(view)} (fleetctl breakglass unpin {model})"


def _held_by(view: dict[str, Any] | None) -> str:
    if not view:
        return ""
    until = f" until {view['expires_at']}" if view.get("expires_at") else ""
    return f"; by {view.get('updated_by')}{until}: {view.get('reason') or '(no reason)'}"


def drift_line(drifted: int) -> str:
    if not drifted:
        return ""
    return (f"\ndrift: {drifted} engine(s) run a config that differs from their class revision "
            "(fleetctl class diff --live MODEL)")
