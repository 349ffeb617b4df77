"""The Rollouts screen's content: the table of rollouts (active first, then the finished ones, dimmed) and
the detail of the selected one: its phase, the weights, its steps with the current one marked, each gate's
latest value against its threshold, the time left in a timed pause (`left_s`, counted down by the screen
with the app's clock: ui/present/timefmt.Countdowns), and its latest events."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rich.text import Text

from fleetctl.controller.rollout.spec import Condition
from fleetctl.controller.rollout.view import GateView, MeasurementView, RolloutView
from fleetctl.controller.watch_contract import FleetEventView
from ui.present.timefmt import NONE, clock_time, duration

FINISHED = frozenset({"completed", "aborted"})
RECENT_EVENTS = 8
COLUMNS = ("ID", "MODEL", "A -> B", "PHASE", "STEP", "B%", "PAUSE")
PHASES = {"progressing": ("◌", "dodger_blue1"), "paused": ("॥", "yellow"), "aborting": ("◌", "orange_red1"),
          "aborted": ("✖", "orange_red1"), "completed": ("✔", "green")}
STEPS = {"done": ("✔", "green"), "current": ("▶", "bold dodger_blue1"), "pending": (" ", "dim"),
         "skipped": ("↷", "dim"), "not_run": ("✖", "dim")}
GATES = {"Successful": ("✔", "green"), "Failed": ("✖", "orange_red1"), "Error": ("⚠", "orange_red1"),
         "Inconclusive": ("?", "yellow"), "Running": ("◌", "dodger_blue1"), "Pending": ("◷", "yellow")}
OPS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}
PAUSE_REASONS = {
    "CanaryPauseStep": "pause step",
    "InconclusiveAnalysisRun": "analysis inconclusive: promote or abort",
    "PausedByOperator": "paused by an operator: resume to continue",
    "EngineConfigDrift": "an engine's config drifted from its class",
}


def is_active(view: RolloutView) -> bool:
    return view.phase not in FINISHED


def ordered(rollouts: Iterable[RolloutView]) -> list[RolloutView]:
    """Active rollouts by id, then the finished ones, newest first."""
    views = list(rollouts)
    active = sorted((v for v in views if is_active(v)), key=lambda v: v.id)
    finished = sorted((v for v in views if not is_active(v)), key=lambda v: v.id, reverse=True)
    return active + finished


def phase_text(view: RolloutView) -> Text:
    icon, colour = PHASES.get(view.phase, ("?", "yellow"))
    return Text(f"{icon} {view.phase}", style=colour)


def step_position(view: RolloutView) -> str:
    """'3/6': the current step (1-based) of an active rollout; the steps done of a finished one."""
    total = len(view.steps)
    if is_active(view):
        return f"{min(view.step_index + 1, total)}/{total}"
    return f"{sum(1 for s in view.steps if s.status == 'done')}/{total}"


def row(view: RolloutView, left_s: float | None) -> tuple[Text, ...]:
    """The rollout's table row; finished rollouts dimmed."""
    cells = (Text(str(view.id)), Text(view.model), Text(f"{view.from_ref} -> {view.to_ref}"), phase_text(view),
             Text(step_position(view)), Text(f"{view.weight}%"),
             Text(duration(left_s) if left_s is not None else "", style="yellow"))
    if not is_active(view):
        for cell in cells:
            cell.stylize("dim")
    return cells


def rows(views: Iterable[RolloutView], left: Mapping[str, float | None]) -> list[tuple[str, tuple[Text, ...]]]:
    return [(str(v.id), row(v, left.get(str(v.id)))) for v in ordered(views)]


# --- the detail of one rollout ---

def title(view: RolloutView) -> str:
    """The detail pane's title: 'rollout 7: smollm2-135m chat@r1 -> chat@r2'."""
    return f"rollout {view.id}: {view.model} {view.from_ref} -> {view.to_ref}"


def detail(view: RolloutView, left_s: float | None, events: Iterable[FleetEventView] = ()) -> Text:
    """The selected rollout: status, weights, engines, steps, gates, and its latest events."""
    lines = [status(view, left_s), weights(view), engines(view)]
    lines += [Text("steps", style="bold")] + steps(view, left_s)
    if view.gates:
        lines += [Text("gates", style="bold")] + [line for gate in view.gates for line in gate_lines(view, gate)]
    recent = list(events)[-RECENT_EVENTS:]
    if recent:
        lines += [Text("events", style="bold")] + [event_line(event) for event in recent]
    return Text("\n").join(lines)


def status(view: RolloutView, left_s: float | None) -> Text:
    """'॥ paused: pause step, 1m35s left'; the abort reason, an allowed correctness change, the message."""
    line = phase_text(view)
    if view.phase == "paused" and view.pause_reason:
        line.append(f": {pause_text(view, left_s)}", style="yellow")
    elif view.abort_reason:
        line.append(f": {view.abort_reason}", style="orange_red1")
    if view.allow_correctness_change:
        line.append(f"  correctness change allowed: {view.allow_correctness_change}", style="magenta")
    if view.message:
        line.append(f"  {view.message}", style="dim")
    return line


def event_line(event: FleetEventView) -> Text:
    style = "orange_red1" if event.severity == "alert" else "dark_orange" if event.severity == "warning" else ""
    line = Text.assemble(("  " + clock_time(event.at), "dim"), " ", (event.message, style))
    if event.actor:
        line.append(f" ({event.actor})", style="dim")
    return line


def events_of(view: RolloutView, events: Iterable[FleetEventView]) -> list[FleetEventView]:
    """The stream's events about this rollout (its transitions, and the operators' calls on it)."""
    subject = f"rollouts/{view.id}"
    return [event for event in events if event.subject == subject]


def pause_text(view: RolloutView, left_s: float | None) -> str:
    text = PAUSE_REASONS.get(view.pause_reason or "", view.pause_reason or "")
    if view.pause_reason == "CanaryPauseStep":
        text += ": until promote" if left_s is None else f", {duration(left_s)} left"
    if view.paused_by:
        text += f" (by {view.paused_by})"
    return text


def weights(view: RolloutView) -> Text:
    shown = " ".join(f"{ref}={weight:g}" for ref, weight in view.weights.items()) or NONE
    line = Text.assemble(("weights ", "bold"), shown, f" · B asks {view.weight}% · ")
    if view.acknowledged:
        line.append("✔ on every gateway", style="green")
    else:
        line.append("◷ not on every gateway yet", style="yellow")
    return line


def engines(view: RolloutView) -> Text:
    line = Text("engines ", style="bold")
    for role, ref in (("A", view.from_ref), ("B", view.to_ref)):
        ready, desired = view.ready.get(ref, 0), view.desired.get(ref, 0)
        line.append(f"{role} {ref} ")
        line.append(f"{ready}/{desired} ready", style="green" if ready >= desired else "yellow")
        line.append(" · " if role == "A" else "  ")
    for ref, drifted in sorted(view.drifted.items()):
        if drifted:
            line.append(f"drifted on {ref}: {', '.join(drifted)}  ", style="bold orange_red1")
    return line


def steps(view: RolloutView, left_s: float | None) -> list[Text]:
    lines = []
    for step in view.steps:
        icon, style = STEPS.get(step.status, ("?", ""))
        line = Text.assemble((f"  {icon} {step.index}: ", style),
                             (step.text, "bold" if step.status == "current" else style))
        if step.status == "current" and left_s is not None:
            line.append(f"  {duration(left_s)} left", style="yellow")
        lines.append(line)
    return lines


# --- gates ---

def measure_label(measure: str) -> str:
    """ttft_p90_s -> 'ttft p90'; error_rate -> 'error rate'."""
    return " ".join(part for part in measure.split("_") if part != "s") or NONE


def value_text(measure: str, value: float | None) -> str:
    if value is None:
        return "not measured" if measure == "quality" else NONE
    if measure == "quality":
        return "pass" if value >= 1 else "fail"
    if measure.endswith("_rate"):
        return f"{value * 100:.3g}%"
    return (f"{value:.2f}" if value >= 0.1 else f"{value:.3g}") + " s"


def gate_lines(view: RolloutView, gate: GateView) -> tuple[Text, Text]:
    """'◌ ttft p90  0.41 s ≤ 0.46 s (1.2 × A 0.38 s)', then its template/metric, phase and counts."""
    icon, colour = GATES.get(gate.phase, ("?", "yellow"))
    first = Text.assemble((f"  {icon} ", colour), (measure_label(gate.measure), "bold"), "  ")
    first.append_text(comparison(view, gate))
    second = Text.assemble((f"      {gate.template}/{gate.metric} · ", "dim"), (gate.phase, colour),
                           (f" · ✔ {gate.successful}", "dim"))
    limit = "off" if gate.failure_limit < 0 else str(gate.failure_limit)
    second.append(f" · failed {gate.failed}/{limit}", style="orange_red1" if gate.failed else "dim")
    if gate.next_in_s is not None and gate.phase in ("Running", "Pending"):
        second.append(f" · next {duration(gate.next_in_s)}", style="dim")
    return first, second


def comparison(view: RolloutView, gate: GateView) -> Text:
    """'0.41 s ≤ 0.46 s' when the latest value meets the condition, '0.93 s, needs ≤ 0.46 s' when it does
    not, '0.41 s (fails if > 0.50 s)' for a failureCondition; why there is no value otherwise."""
    latest = gate.latest
    if latest is None:
        return Text("no measurement yet", style="dim")
    if latest.value is None:
        missing = value_text(gate.measure, None)
        reason = "" if latest.message in ("", missing) else f" ({latest.message})"
        return Text(missing + reason, style="yellow")
    return _against_threshold(gate, latest, _is_failure_condition(view, gate))


def _against_threshold(gate: GateView, latest: MeasurementView, failure: bool) -> Text:
    value = value_text(gate.measure, latest.value)
    try:
        condition = Condition.parse(gate.condition)
    except ValueError:
        condition = None
    if gate.measure == "quality" or condition is None or latest.threshold is None or latest.value is None:
        return Text(value)
    op, threshold = OPS[condition.op], value_text(gate.measure, latest.threshold)
    baseline = ""
    if condition.relative and latest.baseline is not None:
        scale = "" if condition.factor == 1 else f"{condition.factor:g} × "
        baseline = f" ({scale}A {value_text(gate.measure, latest.baseline)})"
    if failure:
        return Text(f"{value} (fails if {op} {threshold}{baseline})")
    if condition.holds(latest.value, latest.baseline):
        return Text(f"{value} {op} {threshold}{baseline}", style="green")
    return Text(f"{value}, needs {op} {threshold}{baseline}", style="orange_red1")


def _is_failure_condition(view: RolloutView, gate: GateView) -> bool:
    """The view carries one condition per gate: the successCondition when the metric has one."""
    templates = view.spec.get("templates") or {}
    metrics = (templates.get(gate.template) or {}).get("metrics") or [] if isinstance(templates, dict) else []
    metric = next((m for m in metrics if isinstance(m, dict) and m.get("name") == gate.metric), {})
    return metric.get("successCondition") is None and metric.get("failureCondition") == gate.condition
