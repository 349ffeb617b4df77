"""`fleetctl rollout start|list|status|watch|pause|resume|promote|abort|retry|undo|history`.

A rollout is named by its id, or by its model (the model's active rollout, else its latest). The spec is
validated by the controller, whole, before anything is stored: a bad one is one line and exit 2 (usage).

`start` takes a spec file (`-f FILE`, YAML: docs/rollouts.md) or, for the common case, flags:
`fleetctl rollout start MODEL --to NAME@rN --steps 10,50,100 --pause 2m` builds the steps
`scale`, then for each weight `setWeight W` and (with --pause, unless W is 100) `pause DURATION`; a last
`setWeight 100` is added when the weights stop short of it. `--analysis FILE` adds the templates of FILE
(YAML: {NAME: {metrics: [...]}}) as background analysis from the first setWeight on.

The verbs that move traffic (start, promote, abort, retry, undo) take --yes like every such command; of
them only a start whose spec allows a correctness change asks first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status
from fleetctl.client import ControllerClient
from fleetctl.controller.rollout.view import RolloutView
from fleetctl.errors import NotFound, ValidationFailed

NAME = "rollout"
app = typer.Typer(no_args_is_help=True, help="Phased rollouts of a model from one class revision to another.")

TargetArg = Annotated[str, typer.Argument(help="rollout ID, or MODEL (its active rollout, else its latest)")]

LIST_COLUMNS = [col("ID", "id"), col("MODEL", "model"), col("FROM", "from_ref"), col("TO", "to_ref"),
                col("PHASE", "phase"), Column("STEP", lambda r: f"{r['step_index']}/{len(r['steps'])}"),
                Column("WEIGHT", lambda r: f"{r['weight']}%"), col("UPDATED", "updated_at")]
HISTORY_COLUMNS = [col("AT", "at"), col("ACTOR", "actor"), col("EVENT", "event"), col("MESSAGE", "message")]
MARKERS = {"done": "✓", "current": "▶", "pending": " ", "skipped": "-", "not_run": "x"}


# --- building a spec from flags (pure) ---

def parse_steps(text: str) -> list[int]:
    """'10,50,100' -> [10, 50, 100]; the controller checks the range and the order."""
    try:
        weights = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValidationFailed(f"--steps: {text!r} is not a comma-separated list of percentages, e.g. 10,50,100",
                               field="steps") from None
    if not weights:
        raise ValidationFailed("--steps: give at least one weight, e.g. 10,50,100", field="steps")
    return weights


def spec_from_flags(model: str, to: str, weights: list[int], pause: str | None, from_ref: str | None = None,
                    replicas: int | None = None, allow_correctness_change: str | None = None,
                    templates: dict[str, Any] | None = None) -> dict[str, Any]:
    if weights[-1] != 100:
        weights = [*weights, 100]
    steps: list[dict[str, Any]] = [{"scale": {}}]
    for weight in weights:
        steps.append({"setWeight": weight})
        if pause is not None and weight != 100:
            steps.append({"pause": {"duration": pause}})
    spec: dict[str, Any] = {"model": model, "to": to, "steps": steps}
    if from_ref is not None:
        spec["from"] = from_ref
    if replicas is not None:
        spec["replicas"] = replicas
    if allow_correctness_change is not None:
        spec["allowCorrectnessChange"] = {"reason": allow_correctness_change}
    if templates:
        spec["templates"] = templates
        spec["analysis"] = {"templates": sorted(templates), "startingStep": 1}  # from the first setWeight
    return spec


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValidationFailed(f"{path}: expected a mapping ({what})", field="file")
    return document


# --- naming a rollout ---

def resolve(api: ControllerClient, target: str) -> RolloutView:
    """An id, or a model: its active rollout, else its latest."""
    if target.isdigit():
        return api.get_rollout(int(target))
    rollouts = api.list_rollouts(model=target)
    if not rollouts:
        raise NotFound(f"no rollout of model {target!r}", field="model")
    active = [r for r in rollouts if r.phase not in ("completed", "aborted")]
    return (active or rollouts)[-1]


# --- drawing a rollout (pure) ---

def describe(view: RolloutView) -> str:
    lines = [f"rollout {view.id}: {view.model} {view.from_ref} -> {view.to_ref}  {view.phase}"
             + (f" ({view.pause_reason}{' by ' + view.paused_by if view.paused_by else ''})" if view.pause_reason else "")]
    weights = " ".join(f"{ref}={weight:g}" for ref, weight in view.weights.items())
    lines.append(f"weights: {weights or '-'}  ({'acknowledged' if view.acknowledged else 'not yet acknowledged'} "
                 f"by every gateway); B asked for {view.weight}%")
    lines.append("engines: " + ", ".join(f"{ref} {view.ready.get(ref, 0)}/{view.desired.get(ref, 0)} ready"
                                         for ref in (view.from_ref, view.to_ref)))
    for step in view.steps:
        lines.append(f"  {MARKERS.get(step.status, ' ')} {step.index}: {step.text}")
    if view.pause_left_s is not None:
        lines.append(f"pause: {view.pause_left_s:g}s left")
    for gate in view.gates:
        latest = gate.latest.message if gate.latest else "no measurement yet"
        lines.append(f"gate {gate.template}/{gate.metric} ({gate.measure} {gate.condition}): {gate.phase}; {latest}")
    if view.abort_reason:
        lines.append(f"aborted: {view.abort_reason}")
    if view.allow_correctness_change:
        lines.append(f"correctness change allowed: {view.allow_correctness_change}")
    if view.message:
        lines.append(view.message)
    return "\n".join(lines)


def show(view: RolloutView, output: Format) -> None:
    if output is Format.table:
        typer.echo(describe(view))
    else:
        emit(view, output)


# --- commands ---

@app.command("start")
def start(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Argument(help="the model (flags form)", show_default=False)] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="rollout spec YAML (docs/rollouts.md)")] = None,
    to: Annotated[str | None, typer.Option("--to", help="B: the class revision NAME@rN to roll out")] = None,
    steps: Annotated[str | None, typer.Option("--steps", help="B's weights in percent, e.g. 10,50,100")] = None,
    pause: Annotated[str | None, typer.Option("--pause", help="pause after each weight below 100: 30s, 2m, 1h")] = None,
    from_ref: Annotated[str | None, typer.Option("--from", help="A [default: the revision holding all traffic]")] = None,
    replicas: Annotated[int | None, typer.Option("--replicas", min=1, help="B's engines per role [default: A's]")] = None,
    analysis: Annotated[Path | None, typer.Option("--analysis", help="templates YAML {NAME: {metrics: [...]}}: "
                                                                     "background analysis")] = None,
    allow_correctness_change: Annotated[str | None, typer.Option(
        "--allow-correctness-change", metavar="REASON", help="A and B differ in correctness fields: why (audited)")] = None,
    reason: ReasonOption = None,
    yes: YesOption = False,
    output: OutputOption = Format.table,
) -> None:
    """Start a rollout: `-f FILE`, or `MODEL --to NAME@rN --steps 10,50,100 [--pause 2m]`. A spec that
    allows a correctness change asks first (unless --yes)."""
    if file is not None:
        if model or to or steps:
            raise ValidationFailed("give either -f FILE or MODEL --to ... --steps ..., not both", field="file")
        spec = read_yaml_mapping(file, "a rollout spec")
    else:
        if not model or not to:
            raise ValidationFailed("give -f FILE, or MODEL with --to NAME@rN (and --steps)", field="to")
        templates = read_yaml_mapping(analysis, "analysis templates by name") if analysis else None
        spec = spec_from_flags(model, to, parse_steps(steps or "100"), pause, from_ref, replicas,
                               allow_correctness_change, templates)
    allowed = spec.get("allowCorrectnessChange")
    if isinstance(allowed, dict):
        confirm(f"Roll out {spec.get('to')} although its outputs may differ ({allowed.get('reason')})? "
                "This is audited.", yes)
    view = client(ctx).start_rollout(spec, reason)
    status(f"rollout {view.id} started: {view.model} {view.from_ref} -> {view.to_ref}")
    if view.allow_correctness_change:
        status(f"correctness change allowed (audited): {view.allow_correctness_change}")
    show(view, output)


@app.command("list")
def list_rollouts(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", help="only this model's")] = None,
    active: Annotated[bool, typer.Option("--active", help="only rollouts not completed or aborted")] = False,
    output: OutputOption = Format.table,
) -> None:
    """Rollouts, oldest first."""
    emit(client(ctx).list_rollouts(model=model, active=True if active else None), output, LIST_COLUMNS)


@app.command("status")
def rollout_status(ctx: typer.Context, target: TargetArg, output: OutputOption = Format.table) -> None:
    """A rollout: its steps (▶ marks the current one), weights, engines, gates and pause."""
    show(resolve(client(ctx), target), output)


@app.command("history")
def rollout_history(ctx: typer.Context, target: TargetArg, output: OutputOption = Format.table) -> None:
    """What happened to a rollout, oldest first."""
    api = client(ctx)
    emit(api.rollout_history(resolve(api, target).id), output, HISTORY_COLUMNS)


@app.command("watch")
def watch(
    ctx: typer.Context,
    target: TargetArg,
    interval: Annotated[float, typer.Option("--interval", min=0.05, help="seconds between refreshes")] = 1.0,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0, help="give up after this many seconds")] = None,
    exit_on_pause: Annotated[bool, typer.Option("--exit-on-pause", help="exit 9 when the rollout pauses for an "
                                                "operator (an indefinite pause, an inconclusive analysis)")] = False,
) -> None:
    """Follow a rollout live: exit 0 completed, 8 aborted, 9 paused for an operator (--exit-on-pause)."""
    from fleetctl.cli.rollout_watch import watch as watch_rollout  # the live screen (rich)
    from rich.console import Console

    api = client(ctx)
    rollout_id = resolve(api, target).id
    code = watch_rollout(lambda: api.get_rollout(rollout_id), interval_s=interval, timeout_s=timeout,
                         console=Console(), exit_on_pause=exit_on_pause)
    raise typer.Exit(int(code))


def _command(ctx: typer.Context, target: str, verb: str, reason: str | None, output: Format, full: bool = False) -> None:
    api = client(ctx)
    rollout = resolve(api, target)
    view = api.rollout_command(rollout.id, verb, full=full, reason=reason)
    if verb == "undo":
        status(f"rollout {rollout.id} undone by rollout {view.id}: {view.from_ref} -> {view.to_ref}")
    else:
        status(f"rollout {view.id}: {verb} -> {view.phase}")
    show(view, output)


@app.command("pause")
def pause_cmd(ctx: typer.Context, target: TargetArg, reason: ReasonOption = None, output: OutputOption = Format.table) -> None:
    """Pause: no step advances until `resume` (or `promote`)."""
    _command(ctx, target, "pause", reason, output)


@app.command("resume")
def resume_cmd(ctx: typer.Context, target: TargetArg, reason: ReasonOption = None, output: OutputOption = Format.table) -> None:
    """Resume a paused rollout."""
    _command(ctx, target, "resume", reason, output)


@app.command("promote")
def promote_cmd(ctx: typer.Context, target: TargetArg,
                full: Annotated[bool, typer.Option("--full", help="skip every remaining step: all traffic to B")] = False,
                reason: ReasonOption = None, yes: YesOption = False, output: OutputOption = Format.table) -> None:
    """End the current pause or inconclusive analysis and go on (--full: to 100% on B at once)."""
    _command(ctx, target, "promote", reason, output, full=full)


@app.command("abort")
def abort_cmd(ctx: typer.Context, target: TargetArg, reason: ReasonOption = None, yes: YesOption = False,
              output: OutputOption = Format.table) -> None:
    """All traffic back to A (acknowledged by every gateway), B drained."""
    _command(ctx, target, "abort", reason, output)


@app.command("retry")
def retry_cmd(ctx: typer.Context, target: TargetArg, reason: ReasonOption = None, yes: YesOption = False,
              output: OutputOption = Format.table) -> None:
    """Start an aborted rollout's steps again from the first."""
    _command(ctx, target, "retry", reason, output)


@app.command("undo")
def undo_cmd(ctx: typer.Context, target: TargetArg, reason: ReasonOption = None, yes: YesOption = False,
             output: OutputOption = Format.table) -> None:
    """Roll a completed rollout back: a new rollout to its A with the same steps."""
    _command(ctx, target, "undo", reason, output)

