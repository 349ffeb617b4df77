"""`fleetctl pd status|plan|rebalance|stop|show|list|mode|profile`: prefill:decode ratios (docs/pd.md).

- `status [MODEL]`: per model, the ratio, the engines by role with their queues, the planner's mode and
  recommendation, and a rebalance under way.
- `plan [MODEL]`: the planner's recommendation with its reasoning, line by line.
- `rebalance MODEL --prefill N --decode M [--mixed K] [--apply]`: without --apply, the plan (which engines,
  in which order, the expected effect); with it, the rebalance is started (after a confirmation unless
  --yes) and followed until it is done (--no-wait returns at once). Ctrl-C stops following, not the
  rebalance; `pd stop ID` stops it after the flip in progress.
- `mode MODEL off|advisory|auto [--floor-prefill N ...]`: the planner's mode and settings for a model.
- `profile CLASS_REF`: measure one engine of the class revision (prefill tokens/s, decode slots at the ITL
  SLO) through a gateway and store it (benchmarks/pd_profile.py does the same sweep).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status
from fleetctl.cli.pd_profile import pd_profile
from fleetctl.errors import FleetError, ValidationFailed

NAME = "pd"
app = typer.Typer(no_args_is_help=True, help="Prefill:decode ratios: status, the planner's advice, rebalances.")

ModelArg = Annotated[str, typer.Argument(metavar="MODEL", help="the model", show_default=False)]
OptionalModel = Annotated[str | None, typer.Argument(metavar="[MODEL]", help="one model (default: all)",
                                                     show_default=False)]
RebalanceId = Annotated[int, typer.Argument(metavar="ID", help="the rebalance", show_default=False)]
TERMINAL = ("completed", "stopped")


def _ratio(r: dict[str, Any]) -> str:
    mixed = f" +{r['mixed']}M" if r.get("mixed") else ""
    return f"{r['prefill']}P:{r['decode']}D{mixed}"


def _queues(model: dict[str, Any], role: str) -> int:
    return sum(e["waiting"] for e in model["engines"] if e["role"] == role)


STATUS_COLUMNS = [
    col("MODEL", "model"), col("CLASS", "class_ref"), Column("RATIO", lambda m: _ratio(m["ratio"])),
    Column("P-QUEUE", lambda m: _queues(m, "prefill")), Column("D-QUEUE", lambda m: _queues(m, "decode")),
    col("MODE", "mode"),
    Column("ADVICE", lambda m: _advice(m["recommendation"])),
    Column("REBALANCE", lambda m: f"{m['rebalance']['id']} {m['rebalance']['phase']}" if m["rebalance"] else "-"),
]
REBALANCE_COLUMNS = [
    col("ID", "id"), col("MODEL", "model"), col("CLASS", "class_ref"), Column("TARGET", lambda r: _ratio(r["target"])),
    col("PHASE", "phase"), Column("FLIPS", lambda r: len(r["flips"])), col("BY", "created_by"), col("MESSAGE", "message"),
]
FLIP_COLUMNS = [col("ENGINE", "engine"), col("FROM", "from_role"), col("TO", "to_role"), col("COST", "cost")]


def _advice(rec: dict[str, Any] | None) -> str:
    if rec is None or not rec["measured"]:
        return "not measured"
    if not rec["changes"]:
        return "hold"
    held = f" (held: {rec['blocked_by']})" if rec["blocked_by"] else ""
    return f"-> {_ratio(rec['recommended'])}{held}"


@app.command("status")
def pd_status(ctx: typer.Context, model: OptionalModel = None, output: OutputOption = Format.table) -> None:
    """Each model's ratio, queues, planner mode and advice, and the rebalance under way."""
    emit(client(ctx).pd_status(model), output, STATUS_COLUMNS)


@app.command("plan")
def pd_plan(ctx: typer.Context, model: OptionalModel = None, output: OutputOption = Format.table) -> None:
    """The planner's recommendation and why, line by line."""
    models = client(ctx).pd_status(model)
    if output is not Format.table:
        emit([{"model": m.model, "class_ref": m.class_ref, "mode": m.mode, "profile": m.profile,
               "recommendation": m.recommendation} for m in models], output)
        return
    for m in models:
        rec = m.recommendation
        typer.echo(f"{m.model} ({m.class_ref or 'several revisions'}, mode {m.mode}, profile {m.profile['source']}): "
                   f"{_ratio(m.ratio.model_dump())}")
        if rec is None:
            typer.echo("  no recommendation yet")
            continue
        for line in rec.reasons:
            typer.echo(f"  {line}")
        verdict = "hold" if not rec.changes else f"{_ratio(rec.recommended.model_dump())}" + (
            f" (held: {rec.blocked_by})" if rec.blocked_by else "")
        typer.echo(f"  recommendation: {verdict}")


@app.command("rebalance")
def pd_rebalance(
    ctx: typer.Context,
    model: ModelArg,
    prefill: Annotated[int, typer.Option("--prefill", min=0, help="prefill engines when done", show_default=False)],
    decode: Annotated[int, typer.Option("--decode", min=0, help="decode engines when done", show_default=False)],
    mixed: Annotated[int | None, typer.Option("--mixed", min=0, help="mixed engines when done (default: as now)",
                                              show_default=False)] = None,
    apply: Annotated[bool, typer.Option("--apply", help="start it (without: only print the plan)")] = False,
    floor_prefill: Annotated[int | None, typer.Option("--floor-prefill", min=1, help="default: the model's (1)",
                                                      show_default=False)] = None,
    floor_decode: Annotated[int | None, typer.Option("--floor-decode", min=1, help="default: the model's (1)",
                                                     show_default=False)] = None,
    ttft_slo_s: Annotated[float | None, typer.Option("--ttft-slo", help="TTFT p90 seconds to keep while flipping",
                                                     show_default=False)] = None,
    itl_slo_s: Annotated[float | None, typer.Option("--itl-slo", help="ITL p90 seconds to keep while flipping",
                                                    show_default=False)] = None,
    baseline_s: Annotated[float, typer.Option("--baseline", min=0, help="seconds of latency measured first")] = 30.0,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="follow it until done")] = True,
    timeout: Annotated[float, typer.Option("--timeout", min=0, help="seconds to follow it")] = 1800.0,
    reason: ReasonOption = None,
    yes: YesOption = False,
    output: OutputOption = Format.table,
) -> None:
    """Flip MODEL's engines one at a time to --prefill/--decode(/--mixed). Without --apply: the plan."""
    api = client(ctx)
    common = dict(mixed=mixed, floor_prefill=floor_prefill, floor_decode=floor_decode, ttft_slo_s=ttft_slo_s,
                  itl_slo_s=itl_slo_s, baseline_s=baseline_s)
    preview = api.pd_rebalance(model, prefill, decode, apply=False, **common).preview
    if not preview.changes:
        status(f"{model} is already at {_ratio(preview.target.model_dump())}: nothing to do")
        if output is not Format.table:
            emit(preview, output)
        return
    if not apply:
        _print_plan(preview.model_dump(), output)
        return
    confirm(f"Flip {len(preview.flips)} engine(s) of {model} ({preview.class_ref}) from "
            f"{_ratio(preview.current.model_dump())} to {_ratio(preview.target.model_dump())}, one at a time? "
            "Each drains first. This is audited.", yes)
    started = api.pd_rebalance(model, prefill, decode, apply=True, reason=reason, **common).rebalance
    if started is None:
        status(f"{model} is already at the target: nothing to do")
        return
    status(f"rebalance {started.id} started (stop it after the flip in progress: fleetctl pd stop {started.id})")
    if not wait:
        emit(started, output, REBALANCE_COLUMNS)
        return
    final = follow(api, started.id, timeout)
    emit(final, output, REBALANCE_COLUMNS)
    if final.phase == "stopped":
        status(f"rebalance {final.id} {final.message}")
        raise typer.Exit(ExitCode.REBALANCE_STOPPED)


def _print_plan(preview: dict[str, Any], output: Format) -> None:
    if output is not Format.table:
        emit(preview, output)
        return
    typer.echo(f"{preview['model']} ({preview['class_ref']}): {_ratio(preview['current'])} -> "
               f"{_ratio(preview['target'])}, {len(preview['flips'])} flip(s), one at a time:")
    emit(preview["flips"], output, FLIP_COLUMNS)
    for line in preview["effect"]:
        typer.echo(f"  {line}")
    typer.echo("(the plan only: add --apply to start it)")


def follow(api: Any, rebalance_id: int, timeout_s: float, poll_s: float = 1.0) -> Any:
    """Print each new event of the rebalance on stderr until it is terminal; the last view."""
    deadline, seen = time.monotonic() + timeout_s, 0
    try:
        while True:
            view = api.get_rebalance(rebalance_id)
            for event in view.events[seen:]:
                status(f"{event.at[11:19]}  {event.event:<14} {event.message}")
            seen = len(view.events)
            if view.phase in TERMINAL:
                return view
            if time.monotonic() >= deadline:
                raise FleetError(f"rebalance {rebalance_id} still {view.phase} after {timeout_s:g}s; it goes on "
                                 f"(fleetctl pd show {rebalance_id})", code="timeout")
            time.sleep(poll_s)
    except KeyboardInterrupt:
        status(f"stopped following; rebalance {rebalance_id} goes on (fleetctl pd show {rebalance_id})")
        raise typer.Exit(130) from None


@app.command("stop")
def pd_stop(ctx: typer.Context, rebalance_id: RebalanceId, reason: ReasonOption = None,
            output: OutputOption = Format.table) -> None:
    """Stop rebalance ID after the flip in progress (the ratio stays whole)."""
    view = client(ctx).stop_rebalance(rebalance_id, reason)
    status(f"rebalance {rebalance_id} stops after the flip in progress")
    emit(view, output, REBALANCE_COLUMNS)


@app.command("show")
def pd_show(ctx: typer.Context, rebalance_id: RebalanceId, output: OutputOption = Format.table) -> None:
    """A rebalance with its flips and history."""
    view = client(ctx).get_rebalance(rebalance_id)
    if output is not Format.table:
        emit(view, output)
        return
    emit(view, output, REBALANCE_COLUMNS)
    for event in view.events:
        typer.echo(f"{event.at}  {event.actor:<12} {event.event:<14} {event.message}")


@app.command("list")
def pd_list(ctx: typer.Context, model: OptionalModel = None, output: OutputOption = Format.table) -> None:
    """Rebalances, newest first."""
    emit(client(ctx).list_rebalances(model), output, REBALANCE_COLUMNS)


@app.command("mode")
def pd_mode(
    ctx: typer.Context,
    model: ModelArg,
    mode: Annotated[str | None, typer.Argument(metavar="[off|advisory|auto]", help="the planner's mode",
                                               show_default=False)] = None,
    floor_prefill: Annotated[int | None, typer.Option("--floor-prefill", min=1, show_default=False)] = None,
    floor_decode: Annotated[int | None, typer.Option("--floor-decode", min=1, show_default=False)] = None,
    ttft_slo_s: Annotated[float | None, typer.Option("--ttft-slo", help="seconds, p90", show_default=False)] = None,
    itl_slo_s: Annotated[float | None, typer.Option("--itl-slo", help="seconds, p90", show_default=False)] = None,
    headroom: Annotated[float | None, typer.Option("--headroom", min=0, help="plan for need x (1 + this)",
                                                   show_default=False)] = None,
    cooldown_s: Annotated[float | None, typer.Option(
        "--cooldown", min=0, help="seconds between two changes of the ratio [300]", show_default=False)] = None,
    dwell_s: Annotated[float | None, typer.Option(
        "--dwell", min=0, help="seconds a change must stand before it is acted on [20]", show_default=False)] = None,
    reason: ReasonOption = None,
    output: OutputOption = Format.table,
) -> None:
    """Set MODEL's planner mode (off: show only; advisory: record advice; auto: act) and settings."""
    if mode is not None and mode not in ("off", "advisory", "auto"):
        raise ValidationFailed(f"mode: one of off, advisory, auto, not {mode!r}", field="mode")
    settings = (floor_prefill, floor_decode, ttft_slo_s, itl_slo_s, headroom, cooldown_s, dwell_s)
    if mode is None and all(v is None for v in settings):
        raise ValidationFailed("give a mode or a setting to change", field="mode")
    view = client(ctx).pd_settings(model, mode=mode, floor_prefill=floor_prefill, floor_decode=floor_decode,
                                   ttft_slo_s=ttft_slo_s, itl_slo_s=itl_slo_s, headroom=headroom, reason=reason,
                                   cooldown_s=cooldown_s, dwell_s=dwell_s)
    status(f"{model}: planner {view.mode}")
    emit(view, output, STATUS_COLUMNS)


app.command("profile")(pd_profile)  # fleetctl/cli/pd_profile.py: the sweep that measures one engine
