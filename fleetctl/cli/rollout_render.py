"""Drawing a rollout: the screen `fleetctl rollout watch` refreshes, and the one-line form it prints when
stdout is not a terminal. Pure: a `RolloutView` (what the API answers) in, rich text or a string out.

The screen, top to bottom (every line cut to `width`, so nothing wraps; a wider terminal gets longer bars
and less cut text):

    Rollout      #7 smollm2-135m · chat@r1 → chat@r2
    Status       ◌ progressing · step 3/6
    Message      …
    Steps        ✔ done, ▶ current (with the time left in a timed pause), pending, ↷ skipped
    Traffic      A and B as bars of the stored weights, acknowledged or waiting for gateways,
                 ready/desired engines per revision, drifted engines in red
    Analysis     each gate: its latest value against its threshold, its counters, why it was inconclusive
    Progress     steps done over steps

Icons and colours follow `kubectl argo rollouts get rollout --watch`: ◷ waiting (yellow), ◌ progressing
(blue), ॥ paused (yellow), ✔ successful (green), ✖ failed (red), ⚠ error (red), ? inconclusive (yellow).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from fleetctl.controller.rollout.state import (
    ERROR,
    FAILED,
    INCONCLUSIVE_PHASE,
    PENDING,
    RUNNING,
    SUCCESSFUL,
)
from fleetctl.controller.rollout.view import GateView, MeasurementView, RolloutView, StepView

LABEL = 13  # the header's label column
MAX_STEPS = 10  # lines of steps at most: those around the current one, and a line for the rest
MAX_BAR = 60

PHASES = {
    "progressing": ("◌", "bright_blue"),
    "paused": ("॥", "yellow"),
    "aborting": ("◌", "red"),
    "aborted": ("✖", "red"),
    "completed": ("✔", "green"),
}
OUTCOMES = {
    SUCCESSFUL: ("✔", "green"),
    FAILED: ("✖", "red"),
    ERROR: ("⚠", "red"),
    INCONCLUSIVE_PHASE: ("?", "yellow"),
    RUNNING: ("◌", "bright_blue"),
    PENDING: ("◷", "yellow"),
}
STEPS = {"done": ("✔", "green"), "current": ("▶", "bold bright_blue"), "pending": (" ", "dim"),
         "skipped": ("↷", "dim"), "not_run": ("✖", "dim")}
KINDS = {"step": "step", "background": "bg"}  # which analysis run a gate belongs to
OPS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}


# --- the screen ---

def render(view: RolloutView, now: datetime | None = None, width: int = 80, *,
           problem: str | None = None, height: int | None = None) -> RenderableType:
    """The whole screen for `view`, every line at most `width` cells. `now` adds the view's age;
    `problem` (a failed refresh) is shown in red above everything; `height` (a terminal's rows) drops the
    blank lines between sections, then steps far from the current one, to keep the progress bar on screen."""
    lines = _screen(view, now, width, problem, gaps=True, max_steps=MAX_STEPS)
    if height is not None and len(lines) > height:
        lines = _screen(view, now, width, problem, gaps=False, max_steps=MAX_STEPS)
    if height is not None and len(lines) > height:
        fewer = min(len(view.steps), MAX_STEPS) - (len(lines) - height)
        lines = _screen(view, now, width, problem, gaps=False, max_steps=max(3, fewer))
    return Group(*(_fit(line, width) for line in lines))


def _screen(view: RolloutView, now: datetime | None, width: int, problem: str | None, *, gaps: bool,
            max_steps: int) -> list[Text]:
    lines: list[Text] = []
    if problem:
        lines.append(_styled("⚠ " + problem, "bold red"))
    lines += header(view, now)
    lines += _section("Steps", steps(view, max_steps), gaps)
    lines += _section("Traffic", traffic(view, width), gaps)
    if view.gates:
        lines += _section("Analysis", gates(view, width), gaps)
    if gaps:
        lines.append(Text(""))
    lines.append(progress(view, width))
    return lines


def render_waiting(problem: str, width: int = 80) -> RenderableType:
    """The screen before the first view arrived."""
    return Group(_fit(_styled("◷ " + problem, "yellow"), width))


def header(view: RolloutView, now: datetime | None = None) -> list[Text]:
    icon, colour = PHASES.get(view.phase, ("?", "yellow"))
    lines = [
        _field("Rollout", Text.assemble((f"#{view.id} ", "bold"), (view.model, "bold"), " · ",
                                        (view.from_ref, "green"), " → ", (view.to_ref, "yellow"))),
        _field("Status", Text.assemble((f"{icon} {view.phase}", f"bold {colour}"), f" · {step_position(view)}")),
    ]
    if view.message:
        lines.append(_field("Message", Text(view.message)))
    if view.phase == "paused" and view.pause_reason:
        lines.append(_field("Paused", Text(pause_text(view), style="yellow")))
    if view.abort_reason:
        lines.append(_field("Aborted", Text(view.abort_reason, style="red")))
    if view.allow_correctness_change:
        lines.append(_field("Correctness", Text(f"change allowed: {view.allow_correctness_change}", style="magenta")))
    updated = _age(view.updated_at, now)
    lines.append(_field("Updated", Text(f"{updated} · started by {view.created_by}", style="dim")))
    return lines


def steps(view: RolloutView, max_steps: int = MAX_STEPS) -> list[Text]:
    shown, before, after = _step_window(view.steps, view.step_index, max_steps)
    lines = [Text(f"  ✔ {before} earlier step(s) done", style="dim")] if before else []
    for step in shown:
        icon, style = STEPS.get(step.status, ("?", ""))
        line = Text.assemble(("  " + icon + " ", style), (step.text, style if step.status != "current" else "bold"))
        if step.status in ("skipped", "not_run"):
            line.append(" (skipped)" if step.status == "skipped" else " (not run: aborted)", style="dim")
        if step.status == "current" and view.pause_left_s is not None:
            line.append(f"   {duration(view.pause_left_s)} left", style="yellow")
        lines.append(line)
    if after:
        lines.append(Text(f"    … {after} more step(s)", style="dim"))
    return lines


def traffic(view: RolloutView, width: int) -> list[Text]:
    refs = [view.from_ref, view.to_ref] + sorted(set(view.weights) - {view.from_ref, view.to_ref})
    total = sum(view.weights.values())
    name_w = min(max(len(r) for r in refs), 28)
    bar_w = max(10, min(MAX_BAR, width - name_w - 28))
    lines = [_acknowledgement(view)]
    for ref in refs:
        share = 100.0 * view.weights.get(ref, 0.0) / total if total > 0 else 0.0
        lines.append(_weight_line(view, ref, share, name_w, bar_w))
    for ref, engines in sorted(view.drifted.items()):
        if engines:
            lines.append(Text(f"  ✖ drifted on {ref}: {', '.join(engines)}", style="bold red"))
    return lines


def gates(view: RolloutView, width: int) -> list[Text]:
    """One line per gate (a second one says why the latest measurement did not succeed). The comparison
    column is as wide as the widest one allows, so the counters line up and are never cut."""
    wide = width >= 110
    results = [_result(view, gate) for gate in view.gates]
    counters = [_counters(view, gate) for gate in view.gates]
    fixed = 17 + (29 if wide else 0) + max(c.cell_len for c in counters)  # icon, label, template/metric, counters
    column = max(12, min(max(r.cell_len for r in results), width - fixed))
    lines: list[Text] = []
    for gate, result, counted in zip(view.gates, results, counters):
        lines.append(_gate_line(gate, result, column, counted, wide))
        why = _gate_reason(gate)
        if why is not None:
            lines.append(why)
    return lines


def progress(view: RolloutView, width: int) -> Text:
    total = len(view.steps)
    done = sum(1 for s in view.steps if s.status in ("done", "skipped"))  # not_run steps are not done
    bar_w = max(10, min(MAX_BAR + 20, width - LABEL - 22))
    _, colour = PHASES.get(view.phase, ("?", "yellow"))
    line = Text.assemble(("Progress".ljust(LABEL), "bold"))
    line.append_text(bar(view.progress, bar_w, colour))
    line.append(f"  {done}/{total} steps  {view.progress * 100:3.0f}%")
    return line


# --- the one-line form (stdout not a terminal) ---

def summary_line(view: RolloutView) -> str:
    """One line with what matters; `watch` prints it each time it changes. Countdowns are left out, so the
    line changes when the rollout does, not every second."""
    share = _share(view, view.to_ref)
    parts = [
        f"rollout #{view.id} {view.model} {view.from_ref} -> {view.to_ref}: {view.phase}, {step_position(view)}",
        f"{view.to_ref} {share:.0f}% " + ("acknowledged" if view.acknowledged else "waiting for gateways"),
        "ready " + ", ".join(f"{ref} {view.ready.get(ref, 0)}/{view.desired.get(ref, 0)}"
                             for ref in (view.from_ref, view.to_ref)),
    ]
    if view.phase == "paused" and view.pause_reason:
        parts.append("paused: " + pause_text(view, countdown=False))
    drifted = [f"{ref}: {', '.join(e)}" for ref, e in sorted(view.drifted.items()) if e]
    if drifted:
        parts.append("drifted " + "; ".join(drifted))
    parts += [_gate_summary(view, gate) for gate in view.gates]
    if view.abort_reason:
        parts.append(f"aborted: {view.abort_reason}")
    if view.message:
        parts.append(view.message)
    return " | ".join(" ".join(p.split()) for p in parts)


# --- pieces ---

def step_position(view: RolloutView) -> str:
    total = len(view.steps)
    current = next((s for s in view.steps if s.status == "current"), None)
    if current is None:
        return f"step {min(view.step_index, total)}/{total}"
    return f"step {current.index + 1}/{total} ({current.text})"


def pause_text(view: RolloutView, countdown: bool = True) -> str:
    reasons = {
        "CanaryPauseStep": "pause step",
        "InconclusiveAnalysisRun": "analysis inconclusive: promote or abort",
        "PausedByOperator": "paused by an operator: resume to continue",
        "EngineConfigDrift": "an engine's config drifted from its class",
    }
    text = reasons.get(view.pause_reason or "", view.pause_reason or "")
    if view.pause_reason == "CanaryPauseStep":
        text += ": until promote" if view.pause_left_s is None else (
            f", {duration(view.pause_left_s)} left" if countdown else " (timed)")
    if view.paused_by:
        text += f" (by {view.paused_by})"
    return text


def bar(fraction: float, width: int, style: str) -> Text:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"))


def duration(seconds: float) -> str:
    """5 -> '5s'; 72.4 -> '1m 12s'; 3700 -> '1h 01m'; 90000 -> '1d 01h'."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def measure_label(measure: str) -> str:
    """ttft_p90_s -> 'ttft p90'; error_rate -> 'error rate'."""
    return " ".join(p for p in measure.split("_") if p != "s")


def value_text(measure: str, value: float | None) -> str:
    if value is None:
        return "not measured" if measure == "quality" else "–"
    if measure == "quality":
        return "pass" if value >= 1 else "fail"
    if measure.endswith("_rate"):
        return f"{value * 100:.3g}%"
    return (f"{value:.2f}" if value >= 0.1 else f"{value:.3g}") + " s"


def _acknowledgement(view: RolloutView) -> Text:
    target = f"  (B asked for {view.weight}%)"
    if view.acknowledged:
        return Text.assemble(("  ✔ every gateway routes on these weights", "green"), (target, "dim"))
    return Text.assemble(("  ◷ waiting for gateways to apply these weights", "yellow"), (target, "dim"))


def _weight_line(view: RolloutView, ref: str, share: float, name_w: int, bar_w: int) -> Text:
    role, colour = ("A", "green") if ref == view.from_ref else ("B", "yellow") if ref == view.to_ref else (" ", "white")
    ready, desired = view.ready.get(ref, 0), view.desired.get(ref, 0)
    line = Text.assemble(f"  {role} ", (ref.ljust(name_w), colour), " ")
    line.append_text(bar(share / 100.0, bar_w, colour))
    line.append(f" {share:4.0f}%  ")
    line.append(f"ready {ready}/{desired}", style="bold red" if view.drifted.get(ref) else
                "green" if ready >= desired else "yellow")
    return line


def _share(view: RolloutView, ref: str) -> float:
    total = sum(view.weights.values())
    return 100.0 * view.weights.get(ref, 0.0) / total if total > 0 else 0.0


def _gate_line(gate: GateView, result: Text, column: int, counters: Text, wide: bool) -> Text:
    icon, colour = OUTCOMES.get(gate.phase, ("?", "yellow"))
    line = Text.assemble(("  " + icon + " ", colour), (measure_label(gate.measure).ljust(12), "bold"), " ")
    if wide:
        where = f"{KINDS.get(gate.analysis, gate.analysis)} {gate.template}/{gate.metric}"
        line.append(where.ljust(28)[:28] + " ", style="dim")
    result = result.copy()
    result.truncate(column, overflow="ellipsis", pad=True)
    line.append_text(result)
    line.append_text(counters)
    return line


def _result(view: RolloutView, gate: GateView) -> Text:
    """The latest measurement against its threshold, or why there is no value."""
    latest = gate.latest
    if latest is None:
        return Text("no measurement yet", style="dim")
    if latest.value is None:
        missing = value_text(gate.measure, None)
        reason = "" if latest.message in ("", missing) else f"  {latest.message}"
        return Text(missing + reason, style="yellow")
    return comparison(gate, latest, _is_failure(view, gate))


def comparison(gate: GateView, latest: MeasurementView, failure: bool = False) -> Text:
    """'0.41 s ≤ 0.46 s (1.2 × A 0.38 s)' when the condition holds, '0.93 s, needs ≤ 0.46 s (…)' when it does
    not; for a failureCondition, '0.41 s (fails if > 0.50 s)'."""
    op, factor, relative = _condition(gate.condition)
    value = value_text(gate.measure, latest.value)
    if gate.measure == "quality" or latest.threshold is None or latest.value is None or op is None:
        return Text(value)
    threshold = value_text(gate.measure, latest.threshold)
    baseline = ""
    if relative and latest.baseline is not None:
        scale = "" if factor == 1 else f"{factor:g} × "
        baseline = f" ({scale}A {value_text(gate.measure, latest.baseline)})"
    if failure:
        return Text(f"{value} (fails if {OPS[op]} {threshold}{baseline})")
    if _holds(op, latest.value, latest.threshold):
        return Text(f"{value} {OPS[op]} {threshold}{baseline}")
    return Text(f"{value}, needs {OPS[op]} {threshold}{baseline}", style="red")


def _holds(op: str, value: float, limit: float) -> bool:
    return {"<": value < limit, "<=": value <= limit, ">": value > limit, ">=": value >= limit}[op]


def _condition(text: str) -> tuple[str | None, float, bool]:
    """(op, factor, relative) of a gate's condition as written; op None when it does not parse."""
    from fleetctl.controller.rollout.spec import Condition  # lazily: its validators cost CLI start time

    try:
        parsed = Condition.parse(text)
    except ValueError:
        return None, 1.0, False
    return parsed.op, parsed.factor, parsed.relative


def _is_failure(view: RolloutView, gate: GateView) -> bool:
    """Whether the gate's condition is a failureCondition (the view carries one condition per gate: the
    successCondition when there is one)."""
    metric = _metric_spec(view.spec, gate.template, gate.metric) or {}
    return metric.get("successCondition") is None and metric.get("failureCondition") == gate.condition


def _counters(view: RolloutView, gate: GateView) -> Text:
    planned = _planned_count(view, gate)
    text = Text("  ")
    text.append(f"✔ {gate.successful}" + (f"/{planned}" if planned else ""), style="green")
    limit = "off" if gate.failure_limit < 0 else str(gate.failure_limit)
    text.append(f"  failed {gate.failed}/{limit}", style="red" if gate.failed else "")
    if gate.inconclusive:
        text.append(f"  ? {gate.inconclusive}", style="yellow")
    if gate.error:
        text.append(f"  ⚠ {gate.error}", style="red")
    if gate.next_in_s is not None and gate.phase in (RUNNING, PENDING):
        text.append(f"  next {duration(gate.next_in_s)}", style="dim")
    return text


def _gate_reason(gate: GateView) -> Text | None:
    """A second line saying why the latest measurement did not succeed (when it has a value: without one,
    the reason is already on the first line)."""
    latest = gate.latest
    if latest is None or latest.phase == SUCCESSFUL or latest.value is None or not latest.message:
        return None
    _, colour = OUTCOMES.get(latest.phase, ("?", "yellow"))
    return Text(f"      {latest.phase.lower()}: {latest.message}", style=colour)


def _gate_summary(view: RolloutView, gate: GateView) -> str:
    latest = gate.latest
    what = _result(view, gate).plain
    planned = _planned_count(view, gate)
    counts = f"{gate.successful}/{planned}" if planned else str(gate.successful)
    return f"{measure_label(gate.measure)} {what} {gate.phase} ok {counts} failed {gate.failed}"


def _planned_count(view: RolloutView, gate: GateView) -> int | None:
    """The measurements the metric will take, from the stored spec (None: until the rollout ends)."""
    metric = _metric_spec(view.spec, gate.template, gate.metric)
    if metric is None:
        return None
    count, interval = metric.get("count"), metric.get("interval")
    if count is None:
        return None if interval is not None else 1
    return int(count) or None


def _metric_spec(spec: dict[str, Any], template: str, name: str) -> dict[str, Any] | None:
    metrics = (spec.get("templates") or {}).get(template, {}).get("metrics") or []
    return next((m for m in metrics if isinstance(m, dict) and m.get("name") == name), None)


def _step_window(all_steps: list[StepView], step_index: int, limit: int) -> tuple[list[StepView], int, int]:
    """At most `limit` lines of steps around the current one, counting the lines that summarise the hidden
    ones: (shown, hidden before, hidden after)."""
    if len(all_steps) <= limit:
        return all_steps, 0, 0
    shown = max(1, limit - 2)
    start = max(0, min(step_index - 1, len(all_steps) - shown))
    end = start + shown
    return all_steps[start:end], start, len(all_steps) - end


def _age(iso: str, now: datetime | None) -> str:
    try:
        at = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if now is None:
        return at.strftime("%Y-%m-%d %H:%M:%S")
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return f"{duration((now - at).total_seconds())} ago"


def _section(title: str, body: Iterable[Text], gap: bool = True) -> list[Text]:
    return ([Text("")] if gap else []) + [Text(title, style="bold")] + list(body)


def _field(label: str, value: Text) -> Text:
    return Text.assemble((label.ljust(LABEL), "bold"), value)


def _styled(text: str, style: str) -> Text:
    return Text(" ".join(text.split()), style=style)


def _fit(line: Text, width: int) -> Text:
    """One screen line: never wrapped, cut with an ellipsis at `width` cells."""
    line.no_wrap = True
    line.overflow = "ellipsis"
    line.truncate(width, overflow="ellipsis")
    return line
