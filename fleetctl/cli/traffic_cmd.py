"""`fleetctl traffic get|set|shift`: a model's weights over class revisions, and waiting until every live
gateway routes on them.

`set` stores the weights (the controller's split guard may refuse: exit 5, one line), then polls
`GET /api/v1/gateways` until every live gateway reports the routing generation that includes the change
(or a later one), and says how long that took and which gateways. Stale gateways (not heard from for 3
refresh intervals) are named but not waited for.

`shift` moves the traffic to one revision in steps, each stored as by `set` and acknowledged before the
next (fleetctl/cli/traffic_shift.py plans and runs the steps; this module wires them to the controller).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from fleetctl.cli import traffic_shift as shift
from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status, to_plain
from fleetctl.client import ControllerClient
from fleetctl.controller.responses import CorrectnessDifferenceView, GatewayView, TrafficView
from fleetctl.errors import FleetError, Unavailable, ValidationFailed

NAME = "traffic"
app = typer.Typer(no_args_is_help=True, help="Traffic weights over class revisions: get, set, shift.")

ModelArg = Annotated[str, typer.Argument(help="the model name clients ask for")]
USAGE = "expected NAME@rN=WEIGHT, e.g. chat@r1=90 chat@r2=10"
POLL_S = 0.2

REVISION_COLUMNS = [
    col("REVISION", "ref"), col("WEIGHT", "weight"), Column("SHARE", lambda r: f"{r['share'] * 100:g}%"),
    col("READY", "ready_engines"), Column("CORRECTNESS", lambda r: correctness_summary(r["correctness"])),
]
SET_COLUMNS = [col("MODEL", "model"), col("RESULT", "result"), col("GENERATION", "generation"), col("WEIGHTS", "weights"),
               Column("APPLIED BY", lambda r: ",".join(r.get("applied", {}).get("gateways", [])))]
SUMMARY_FIELDS = [("backend", "backend"), ("weights", "weights"), ("weights_revision", "rev"), ("tokenizer", "tokenizer"),
                  ("dtype", "dtype"), ("kv_cache_dtype", "kv"), ("max_model_len", "len"), ("rope_scaling", "rope"),
                  ("sampler", "sampler"), ("engine_version", "engine")]
OPTIONAL_FIELDS = frozenset({"tokenizer", "engine_version"})  # shown only when set


# --- parsing and formatting (pure) ---

def parse_weights(args: list[str]) -> dict[str, float]:
    """['chat@r1=90', 'chat@r2=10'] -> {'chat@r1': 90.0, 'chat@r2': 10.0}; ValidationFailed (exit 2) otherwise."""
    if not args:
        raise ValidationFailed(f"give at least one weight: {USAGE}", field="weights")
    weights: dict[str, float] = {}
    for arg in args:
        ref, weight = _parse_one(arg)
        if ref in weights:
            raise ValidationFailed(f"{ref} is given twice", field="weights")
        weights[ref] = weight
    return weights


def _parse_one(arg: str) -> tuple[str, float]:
    ref, sep, raw = arg.partition("=")
    if not sep or not ref or not raw:
        raise ValidationFailed(f"{arg!r}: {USAGE}", field="weights")
    try:
        from fleetctl.replica_class import parse_ref  # lazily: its models cost every CLI start ~70 ms

        parse_ref(ref)
    except ValueError as exc:
        raise ValidationFailed(f"{arg!r}: {exc}", field="weights") from None
    try:
        weight = float(raw)
    except ValueError:
        raise ValidationFailed(f"{arg!r}: weight {raw!r} is not a number", field="weights") from None
    if not math.isfinite(weight) or weight < 0:
        raise ValidationFailed(f"{arg!r}: weight must be a finite number >= 0", field="weights")
    return ref, weight


def format_weights(weights: dict[str, float]) -> str:
    return " ".join(f"{ref}={weight:g}" for ref, weight in weights.items())


def correctness_summary(fields: dict[str, Any]) -> str:
    """The correctness fields in one short cell: 'backend=reference weights=smollm2 rev=main dtype=float32 …'."""
    parts = [f"{label}={_short(fields.get(name))}" for name, label in SUMMARY_FIELDS
             if not (name in OPTIONAL_FIELDS and fields.get(name) is None)]
    parts += [f"--{flag}={_short(value)}" for flag, value in (fields.get("engine_args") or {}).items()]
    return " ".join(parts)


def _short(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


# --- waiting for gateways (the decision is pure; the loop polls) ---

@dataclass(frozen=True)
class Acks:
    """Where the gateways stand with respect to `generation`."""

    generation: int
    applied: list[str]  # live, at or past the generation
    pending: list[tuple[str, int]]  # live, not yet: (name, the generation they are at)
    stale: list[str]  # not heard from for 3 refresh intervals: not waited for

    @property
    def live(self) -> int:
        return len(self.applied) + len(self.pending)

    @property
    def done(self) -> bool:
        return not self.pending


def acknowledgements(gateways: list[GatewayView], generation: int) -> Acks:
    live = [g for g in gateways if not g.stale]
    return Acks(
        generation=generation,
        applied=sorted(g.name for g in live if g.generation >= generation),
        pending=sorted((g.name, g.generation) for g in live if g.generation < generation),
        stale=sorted(g.name for g in gateways if g.stale),
    )


def progress_line(acks: Acks) -> str:
    waiting = ", ".join(f"{name} at {at}" for name, at in acks.pending)
    return (f"waiting for generation {acks.generation}: {len(acks.applied)}/{acks.live} gateway(s) applied it; "
            f"waiting for {waiting}")


def done_line(acks: Acks, elapsed_s: float) -> str:
    names = ", ".join(acks.applied)
    line = f"generation {acks.generation} applied by {len(acks.applied)} gateway(s) in {elapsed_s:.1f}s: {names}"
    return line + _stale_note(acks)


def _stale_note(acks: Acks) -> str:
    return f"; not waited for (stale): {', '.join(acks.stale)}" if acks.stale else ""


def wait_applied(fetch: Callable[[], list[GatewayView]], generation: int, timeout_s: float, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 say_done: bool = True) -> dict[str, Any]:
    """Poll `fetch` (the gateway list) until every live gateway is at or past `generation`; progress on
    stderr (the closing line only when `say_done`). Returns {gateways, stale, seconds}. FleetError
    `apply_timeout` (exit 1) after `timeout_s`."""
    start, last = clock(), ""
    while True:
        gateways = fetch()
        acks = acknowledgements(gateways, generation)
        elapsed = clock() - start
        if acks.live == 0:
            if say_done:
                status(_nobody(gateways, acks))
            return {"gateways": [], "stale": acks.stale, "seconds": round(elapsed, 3)}
        if acks.done:
            if say_done:
                status(done_line(acks, elapsed))
            return {"gateways": acks.applied, "stale": acks.stale, "seconds": round(elapsed, 3)}
        if elapsed >= timeout_s:
            raise FleetError(_timeout_message(acks, timeout_s), code="apply_timeout")
        line = progress_line(acks)
        if line != last:
            status(line)
            last = line
        sleep(min(poll_s, max(timeout_s - elapsed, 0.01)))


def _nobody(gateways: list[GatewayView], acks: Acks) -> str:
    if not gateways:
        return "no gateways registered; nothing to wait for"
    return f"no live gateways ({len(acks.stale)} stale: {', '.join(acks.stale)}); nothing to wait for"


def _timeout_message(acks: Acks, timeout_s: float) -> str:
    behind = ", ".join(f"{name} (at {at})" for name, at in acks.pending)
    return (f"generation {acks.generation} not applied within {timeout_s:g}s by: {behind}; the change is stored, "
            f"{len(acks.applied)}/{acks.live} gateway(s) applied it")


# --- confirming an allowed correctness change ---

def correctness_preview(api: ControllerClient, weights: dict[str, float]) -> str:
    """What allowing the change lets through, as far as the CLI can tell (the controller decides)."""
    specs = {}
    for ref, weight in weights.items():
        if weight > 0:
            try:
                from fleetctl.replica_class import ReplicaClassSpec

                specs[ref] = ReplicaClassSpec.model_validate(api.get_class(ref).spec)
            except (FleetError, ValueError, KeyError):
                continue  # the controller will name what is wrong with it
    from fleetctl.controller.traffic_guard import correctness_differences  # lazily, as replica_class

    differences = correctness_differences(weights, specs)
    if not differences:
        return "no correctness differences found between the weighted revisions"
    return "; ".join(d.describe() for d in differences)


# --- commands ---

@app.command("get")
def get_traffic(ctx: typer.Context, model: ModelArg, output: OutputOption = Format.table) -> None:
    """MODEL's weights and, for each revision, its ready engines and correctness fields."""
    view = client(ctx).get_traffic(model)
    if output is Format.table:
        status(f"{model}: {format_weights(view.weights)}{_source(view)}")
        if view.drill is not None:
            status(f"{view.drill.description}: in effect until {view.drill.ends_at}; gateways route it on top of "
                   f"these weights (fleetctl drill stop {view.drill.id})")
        emit(view.revisions, output, REVISION_COLUMNS)
    else:
        emit(view, output)


def _source(view: TrafficView) -> str:
    if view.source == "policy":
        return f" (set by {view.updated_by} at {view.updated_at})"
    return " (no policy: every deployed revision equally)"


@app.command("set")
def set_traffic(
    ctx: typer.Context,
    model: ModelArg,
    weights: Annotated[list[str] | None, typer.Argument(
        help="NAME@rN=WEIGHT ... (relative weights, >= 0)", show_default=False)] = None,
    allow_correctness_change: Annotated[bool, typer.Option(
        "--allow-correctness-change",
        help="split across revisions whose correctness fields differ (asks first; audited)")] = False,
    reason: ReasonOption = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until every live gateway applied the change")] = True,
    timeout: Annotated[float, typer.Option("--timeout", min=0, help="seconds to wait for gateways")] = 30.0,
    yes: YesOption = False,
    output: OutputOption = Format.table,
) -> None:
    """Set MODEL's traffic weights, e.g. `fleetctl traffic set smollm2-135m chat@r1=90 chat@r2=10`."""
    parsed = parse_weights(weights or [])
    api = client(ctx)
    if allow_correctness_change and not yes:
        confirm(f"Allow a correctness change for {model} ({format_weights(parsed)})? "
                f"{correctness_preview(api, parsed)}. This is audited.", yes)
    result = api.set_traffic(model, parsed, allow_correctness_change, reason)
    status(f"traffic {model}: {result.result} (routing generation {result.generation})")
    if result.correctness_change_allowed:
        status("correctness change allowed (audited): " + "; ".join(_describe(d) for d in result.correctness_differences))
    shown = to_plain(result)
    if wait:
        shown["applied"] = wait_applied(api.list_gateways, result.generation, timeout)
    emit(shown, output, SET_COLUMNS)


def _describe(difference: CorrectnessDifferenceView) -> str:
    first, second = difference.between
    fields = ", ".join(f"{f.field} {_short(f.first)} -> {_short(f.second)}" for f in difference.fields)
    return f"{first} and {second} differ in {fields}"


# --- traffic shift ---

SHIFT_COLUMNS = [col("STEP", "step"), Column("SHARE", lambda r: f"{r['share']:g}%"), col("GENERATION", "generation"),
                 Column("APPLIED BY", lambda r: ",".join(r["applied"]["gateways"])), col("WEIGHTS", "weights")]


@app.command("shift")
def shift_traffic(
    ctx: typer.Context,
    model: ModelArg,
    to: Annotated[str, typer.Option("--to", help="the revision NAME@rN that has all the traffic at the end",
                                    show_default=False)],
    step: Annotated[float, typer.Option("--step", help="percentage points of traffic moved to --to per step")] = 10.0,
    interval: Annotated[str, typer.Option(
        "--interval", help="wait after each step is applied by every gateway: 30s, 2m, 1h or seconds")] = "30s",
    allow_correctness_change: Annotated[bool, typer.Option(
        "--allow-correctness-change",
        help="split across revisions whose correctness fields differ (asks first; audited)")] = False,
    reason: ReasonOption = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0, help="seconds to wait for gateways, per step")] = 30.0,
    yes: YesOption = False,
    output: OutputOption = Format.table,
) -> None:
    """Move MODEL's traffic to --to in steps: each stored as by `traffic set`, applied by every live
    gateway, then held for --interval. Ctrl-C stops it where it is and says where (exit 130)."""
    to, interval_s = _shift_options(to, step, interval)
    api = client(ctx)
    _check_target(api, model, to)
    start = dict(api.get_traffic(model).weights)
    position = shift.Position(shift.plan_steps(start, to, step), start)
    if not position.steps:
        status(f"traffic {model}: {to} has all the traffic already; nothing to shift")
        emit(shift.summary(model, to, step, interval_s, position, "unchanged"), output, SHIFT_COLUMNS)
        return
    if allow_correctness_change and not yes:
        first = position.steps[0].weights
        confirm(f"Allow a correctness change for {model} (first step {format_weights(first)})? "
                f"{correctness_preview(api, first)}. This is audited.", yes)
    status(f"shifting {model} to {to} in {len(position.steps)} step(s) of {step:g} points, {interval_s:g}s apart, "
           f"from {shift.format_shares(start, to)}")
    _run(api, model, to, step, interval_s, position, _shift_calls(api, model, to, position, allow_correctness_change,
                                                                  reason, timeout), output)


def _shift_options(to: str, step: float, interval: str) -> tuple[str, float]:
    """The options checked before anything is read (ValidationFailed, exit 2, naming the option)."""
    from fleetctl.controller.rollout.spec import parse_duration  # lazily: pydantic models, as replica_class
    from fleetctl.replica_class import parse_ref

    try:
        parse_ref(to)
    except ValueError as exc:
        raise ValidationFailed(f"--to: {exc}", field="to") from None
    if not (shift.MIN_STEP <= step <= 100):
        raise ValidationFailed(f"--step: must be between {shift.MIN_STEP:g} and 100 percentage points, not {step:g}",
                               field="step")
    try:
        return to, parse_duration(interval)
    except ValueError as exc:
        raise ValidationFailed(f"--interval: {exc}", field="interval") from None


def _check_target(api: ControllerClient, model: str, to: str) -> None:
    """--to must exist (NotFound, exit 3) and serve MODEL."""
    served = api.get_class(to).spec.get("model")
    if served != model:
        raise ValidationFailed(f"--to: {to} serves {served!r}, not {model!r}", field="to")


def _shift_calls(api: ControllerClient, model: str, to: str, position: shift.Position, allow: bool,
                 reason: str | None, timeout_s: float) -> shift.ShiftCalls:
    total = len(position.steps)

    def store(step: shift.Step) -> int:
        why = f"{reason}; " if reason else ""
        return api.set_traffic(model, step.weights, allow, f"{why}traffic shift to {to}: step {step.number}/{total}").generation

    return shift.ShiftCalls(
        store=store,
        acknowledge=lambda generation: wait_applied(api.list_gateways, generation, timeout_s, say_done=False),
        sleep=time.sleep, report=status)


def _run(api: ControllerClient, model: str, to: str, step: float, interval_s: float, position: shift.Position,
         calls: shift.ShiftCalls, output: Format) -> None:
    try:
        shift.run_shift(position, to, interval_s, calls)
    except KeyboardInterrupt:
        stored = _read_back(api, model) if position.phase == shift.STORING else None
        status(shift.interrupted_line(model, to, position, stored))
        emit(shift.summary(model, to, step, interval_s, position, "interrupted"), output, SHIFT_COLUMNS)
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except FleetError as exc:
        raise _stopped(exc, model, to, position) from None
    status(f"traffic {model}: all on {to} after {len(position.steps)} step(s)")
    emit(shift.summary(model, to, step, interval_s, position, "completed"), output, SHIFT_COLUMNS)


def _read_back(api: ControllerClient, model: str) -> dict[str, float] | None:
    """The stored weights after an interrupted PUT; None when they cannot be read now."""
    try:
        return dict(api.get_traffic(model).weights)
    except (Exception, KeyboardInterrupt):  # a second Ctrl-C, or the controller gone: say we do not know
        return None


def _stopped(exc: FleetError, model: str, to: str, position: shift.Position) -> FleetError:
    """The step's error (same class, so the same exit code), saying where the weights were left."""
    k, total = position.current, len(position.steps)
    if position.phase == shift.ACKNOWLEDGING:
        where = f"the shift stopped at step {k}/{total}"
    elif isinstance(exc, Unavailable):  # the PUT may or may not have been stored
        where = (f"traffic is at step {k - 1}/{total} or {k}/{total} (step 0: as before the shift); "
                 f"check with `fleetctl traffic get {model}`")
    elif k > 1:
        where = f"traffic left at step {k - 1}/{total} ({shift.format_shares(position.step(k - 1).weights, to)})"
    else:
        return exc  # the first step was refused: nothing changed, and the refusal reads as `traffic set`'s
    return type(exc)(f"step {k}/{total}: {exc.message}; {where}", code=exc.code, field=exc.field, status=exc.status)
