"""`fleetctl canary status [MODEL]`, `fleetctl canary show CLASS`, `fleetctl canary events [MODEL]`: the
canary's verdicts, a class revision's streams and probe history, and the verdict changes.

A stream that has not been measured yet reads 'not measured', never healthy. STAT/H is the divergence
test's statistic against its threshold (it alarms when the first reaches the second; docs/canary.md);
FIRST-DIV is the earliest token position at which a bad probe in the window parted from the reference;
BLAMED is, for the production stream while it is alarmed, the class revision (and engine) serving most of
the bad answers. CLASS 'REF (production)' is the stream of the production-path probes REF served, held to the
answers the model's users should get.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetctl.cli.canary_app import app
from fleetctl.cli.context import client
from fleetctl.cli.output import Column, Format, OutputOption, col, emit

VERDICT_TEXT = {"not_measured": "not measured"}

ModelArg = Annotated[str | None, typer.Argument(help="only this served model", show_default=False)]
LimitOption = Annotated[int, typer.Option("--limit", "-n", min=1, max=1000, help="how many of the latest")]


def verdict_text(verdict: str) -> str:
    return VERDICT_TEXT.get(verdict, verdict)


def stat_over_threshold(stream: dict[str, Any]) -> str | None:
    evidence = stream.get("evidence")
    if not evidence:
        return None
    return f"{evidence['statistic']:.2f}/{evidence['threshold']:.2f}"


def stream_class(stream: dict[str, Any]) -> str:
    """'* (production)' for a model's production stream, 'REF (production)' for the production probes REF
    served, REF for its pinned streams."""
    if stream["kind"] == "production":
        return f"{stream['class_ref'] or '*'} (production)"
    return stream["class_ref"]


def _evidence(key: str) -> Any:
    return lambda s: (s.get("evidence") or {}).get(key)


STREAM_COLUMNS = [
    col("MODEL", "model"), Column("CLASS", stream_class), col("BATCH", "batch"),
    Column("VERDICT", lambda s: verdict_text(s["verdict"])), col("SINCE", "since"),
    Column("PROBES", _evidence("probes")), Column("BAD", _evidence("bad")), Column("STAT/H", stat_over_threshold),
    Column("FIRST-DIV", _evidence("first_divergence")), col("BLAMED", "blamed"),
]


def probe_result(probe: dict[str, Any]) -> str:
    score = probe.get("score")
    if score is None:
        return f"error: {probe.get('error') or 'failed'}"
    if score.get("answer_bad"):
        return "wrong answer"
    return "diverged" if score["diverged"] else "ok"


PROBE_COLUMNS = [
    col("ID", "id"), col("AT", "at"), col("KIND", "kind"), Column("BATCH", lambda p: f"b{p['condition']}"),
    col("ENGINE", "engine"), col("PROMPT", "prompt_id"), Column("RESULT", probe_result),
    Column("FIRST-DIV", lambda p: (p.get("score") or {}).get("first_divergence")),
    Column("DISTANCE", lambda p: round(p["score"]["distance"], 3) if p.get("score") else None),
]
EVENT_COLUMNS = [
    col("AT", "at"), col("MODEL", "model"), Column("CLASS", lambda e: e["class_ref"] or "* (production)"),
    col("BATCH", "batch"), Column("FROM", lambda e: verdict_text(e["verdict_from"])),
    Column("TO", lambda e: verdict_text(e["verdict_to"])), col("MESSAGE", "message"),
]


@app.command("status")
def canary_status(ctx: typer.Context, model: ModelArg = None, output: OutputOption = Format.table) -> None:
    """Each stream's verdict (per class revision and batch condition, and each model's production path)."""
    emit(client(ctx).canary_status(model=model), output, STREAM_COLUMNS)


@app.command("show")
def canary_show(
    ctx: typer.Context,
    class_ref: Annotated[str, typer.Argument(metavar="CLASS", help="NAME@rN, or NAME for its latest revision")],
    limit: LimitOption = 50,
    output: OutputOption = Format.table,
) -> None:
    """A class revision's streams and the latest probes it served."""
    view = client(ctx).canary_class(class_ref, limit=limit)
    if output is not Format.table:
        emit(view, output)
        return
    plain = view.model_dump(mode="json")
    typer.echo(f"class {view.class_ref}")
    emit(plain["streams"], output, STREAM_COLUMNS)
    typer.echo("")
    if plain["probes"]:
        emit(plain["probes"], output, PROBE_COLUMNS)
    else:
        typer.echo("no probes yet")


@app.command("events")
def canary_events(ctx: typer.Context, model: ModelArg = None, limit: LimitOption = 50,
                  output: OutputOption = Format.table) -> None:
    """Verdict changes, oldest first: alerts (drifting, failing), recoveries, and the rest."""
    emit(client(ctx).canary_events(model=model, limit=limit), output, EVENT_COLUMNS)
