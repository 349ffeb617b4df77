"""`fleetctl rollout watch`: the renderer over a range of views (as text in an 80-column console), and the
watch loop over scripted fetch sequences with an injected clock and sleep (no real waiting)."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.rollout_render import duration, render, summary_line, value_text
from fleetctl.cli.rollout_watch import outcome, waits_for_operator, watch
from fleetctl.controller.rollout.view import GateView, MeasurementView, RolloutView, StepView
from fleetctl.errors import FleetError, NotFound, Unavailable

NOW = datetime(2026, 5, 1, 10, 0, 3, tzinfo=timezone.utc)
SPEC: dict[str, Any] = {
    "model": "smollm2-135m", "to": "chat@r2",
    "steps": [{"scale": {}}, {"setWeight": 10}, {"pause": {"duration": "2m"}}, {"analysis": {"templates": ["latency"]}},
              {"setWeight": 50}, {"setWeight": 100}],
    "analysis": {"templates": ["errors"], "startingStep": 1},
    "templates": {
        "latency": {"metrics": [{"name": "ttft", "measure": "ttft_p90_s",
                                 "successCondition": "result <= 1.2 * baseline", "interval": "10s", "count": 3}]},
        "errors": {"metrics": [{"name": "errors", "measure": "error_rate", "successCondition": "result < 0.01",
                                "interval": "30s"}]},
        "slo": {"metrics": [{"name": "itl", "measure": "itl_p99_s", "failureCondition": "result > 0.5"}]},
    },
}
STEP_TEXTS = [("scale", "scale 2 engine(s)"), ("setWeight", "setWeight 10"), ("pause", "pause 2m"),
              ("analysis", "analysis latency"), ("setWeight", "setWeight 50"), ("setWeight", "setWeight 100")]


# --- building views ---

def steps(current: int, texts: list[tuple[str, str]] = STEP_TEXTS) -> list[StepView]:
    def status(i: int) -> str:
        return "done" if i < current else "current" if i == current else "pending"

    return [StepView(index=i, kind=kind, text=text, status=status(i)) for i, (kind, text) in enumerate(texts)]


def measurement(phase: str, value: float | None, baseline: float | None = None, threshold: float | None = None,
                requests: int = 57, message: str = "") -> MeasurementView:
    return MeasurementView(at="2026-05-01T10:00:00+00:00", phase=phase, value=value, baseline=baseline,
                           threshold=threshold, requests=requests, message=message)


def ttft_gate(phase: str = "Running", latest: MeasurementView | None = None, **counters: int) -> GateView:
    values = {"count": 2, "successful": 2, "failed": 0, "inconclusive": 0, "error": 0, **counters}
    return GateView(analysis="step", template="latency", metric="ttft", measure="ttft_p90_s",
                    condition="result <= 1.2 * baseline", phase=phase, failure_limit=0, next_in_s=8.0,
                    latest=latest or measurement("Successful", 0.41, 0.38, 0.456), **values)


def errors_gate(phase: str = "Running", latest: MeasurementView | None = None) -> GateView:
    return GateView(analysis="background", template="errors", metric="errors", measure="error_rate",
                    condition="result < 0.01", phase=phase, count=5, successful=5, failed=0, inconclusive=0, error=0,
                    failure_limit=0, latest=latest or measurement("Successful", 0.002, threshold=0.01, requests=340),
                    next_in_s=21.0)


def view(**changes: Any) -> RolloutView:
    values: dict[str, Any] = dict(
        id=7, model="smollm2-135m", from_ref="chat@r1", to_ref="chat@r2", phase="progressing", step_index=3,
        steps=steps(3), weight=10, weights={"chat@r1": 90.0, "chat@r2": 10.0}, acknowledged=True,
        ready={"chat@r1": 2, "chat@r2": 2}, desired={"chat@r1": 2, "chat@r2": 2},
        message="analysis latency: measurement 2 of 3", gates=[ttft_gate(), errors_gate()], progress=0.5,
        created_at="2026-05-01T09:55:00+00:00", created_by="alice", updated_at="2026-05-01T10:00:00+00:00",
        version=12, spec=SPEC)
    values.update(changes)
    return RolloutView(**values)


def paused_in_timed_pause() -> RolloutView:
    return view(phase="paused", step_index=2, steps=steps(2), pause_reason="CanaryPauseStep", pause_left_s=72.4,
                message="pause 2m", gates=[errors_gate()], progress=2 / 6)


def paused_until_promote() -> RolloutView:
    return view(phase="paused", step_index=2, steps=steps(2), pause_reason="CanaryPauseStep", pause_left_s=None,
                message="pause (until promote)", gates=[errors_gate()], progress=2 / 6)


def inconclusive() -> RolloutView:
    latest = measurement("Inconclusive", None, requests=12, message="12 requests < minRequests 20")
    return view(phase="paused", pause_reason="InconclusiveAnalysisRun",
                gates=[ttft_gate("Inconclusive", latest, successful=1, inconclusive=1), errors_gate()])


def aborted() -> RolloutView:
    latest = measurement("Failed", 0.93, 0.38, 0.456, message="p90 TTFT 0.93 s > 1.2 x 0.38 s")
    return view(phase="aborted", weights={"chat@r1": 100.0}, weight=0, ready={"chat@r1": 2, "chat@r2": 0},
                desired={"chat@r1": 2, "chat@r2": 0}, abort_reason="analysis latency failed: ttft 1 > failureLimit 0",
                message="all traffic back on chat@r1", gates=[ttft_gate("Failed", latest, successful=0, failed=1)])


def completed() -> RolloutView:
    return view(phase="completed", step_index=6, steps=steps(6), weight=100, weights={"chat@r2": 100.0},
                ready={"chat@r1": 0, "chat@r2": 2}, desired={"chat@r1": 0, "chat@r2": 2}, progress=1.0,
                message="all traffic on chat@r2; chat@r1 drained", gates=[errors_gate("Successful")])


def drifted() -> RolloutView:
    return view(phase="paused", step_index=4, steps=steps(4), pause_reason="EngineConfigDrift",
                drifted={"chat@r2": ["engine-b-1"]}, acknowledged=False, progress=4 / 6,
                message="setWeight 50 would send traffic to a drifted engine")


# --- rendering ---

def text_of(renderable: Any, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def lines_of(renderable: Any, width: int = 80) -> list[str]:
    return text_of(renderable, width).splitlines()


def find_line(lines: Iterable[str], needle: str) -> str:
    return next(line for line in lines if needle in line)


def styled_line(renderable: Any, needle: str) -> Text:
    return next(t for t in renderable.renderables if isinstance(t, Text) and needle in t.plain)


ALL_VIEWS: list[Callable[[], RolloutView]] = [view, paused_in_timed_pause, paused_until_promote, inconclusive, aborted,
                                              completed, drifted]


@pytest.mark.parametrize("make", ALL_VIEWS, ids=lambda f: f.__name__)
def test_no_line_is_longer_than_80_columns(make: Callable[[], RolloutView]) -> None:
    for line in lines_of(render(make(), NOW, 80)):
        assert len(line) <= 80, line


def test_long_names_and_messages_are_cut_not_wrapped() -> None:
    long = view(model="m" * 150, from_ref="a-very-long-class-name-indeed@r12", to_ref="another-long-class-name@r13",
                weights={"a-very-long-class-name-indeed@r12": 50.0, "another-long-class-name@r13": 50.0},
                message="word " * 60)
    lines = lines_of(render(long, NOW, 80))
    assert all(len(line) <= 80 for line in lines)
    assert find_line(lines, "Message").endswith("…")
    assert len([line for line in lines if line.startswith("Message")]) == 1  # one line, not wrapped onto more


def test_progressing_mid_way() -> None:
    lines = lines_of(render(view(), NOW, 80))
    text = "\n".join(lines)
    assert "#7 smollm2-135m · chat@r1 → chat@r2" in text
    assert "◌ progressing · step 4/6 (analysis latency)" in text
    assert "Updated      3s ago · started by alice" in text
    assert "  ✔ setWeight 10" in text and "  ✔ pause 2m" in text
    assert "  ▶ analysis latency" in text
    assert "    setWeight 50" in text
    assert "every gateway routes on these weights" in text
    a, b = find_line(lines, "A chat@r1"), find_line(lines, "B chat@r2")
    bar_w = a.count("█") + a.count("░")
    assert bar_w == b.count("█") + b.count("░") >= 40
    assert a.count("█") == round(0.9 * bar_w) and b.count("█") == round(0.1 * bar_w)
    assert " 90%" in a and " 10%" in b
    assert "ready 2/2" in a and "ready 2/2" in b
    ttft = find_line(lines, "ttft p90")
    assert "0.41 s ≤ 0.46 s (1.2 × A 0.38 s)" in ttft
    assert "✔ 2/3" in ttft and "failed 0/0" in ttft and "next 8s" in ttft
    errors = find_line(lines, "error rate")
    assert "0.2% < 1%" in errors and "✔ 5 " in errors  # background: no planned count
    assert errors.index("✔ 5") == ttft.index("✔ 2/3")  # counters line up
    assert "3/6 steps   50%" in find_line(lines, "Progress")


def test_paused_with_time_left() -> None:
    lines = lines_of(render(paused_in_timed_pause(), NOW, 80))
    assert "॥ paused · step 3/6 (pause 2m)" in find_line(lines, "Status")
    assert "pause step, 1m 12s left" in find_line(lines, "Paused")
    assert "1m 12s left" in find_line(lines, "▶ pause 2m")
    assert "until promote" in find_line(lines_of(render(paused_until_promote(), NOW, 80)), "Paused")


def test_inconclusive_gate_says_why() -> None:
    lines = lines_of(render(inconclusive(), NOW, 80))
    assert "analysis inconclusive: promote or abort" in find_line(lines, "Paused")
    gate = find_line(lines, "ttft p90")
    assert gate.lstrip().startswith("?")
    assert "12 requests < minRequests 20" in gate
    assert "? 1" in gate and "✔ 1/3" in gate


def test_aborted() -> None:
    rendered = render(aborted(), NOW, 80)
    lines = lines_of(rendered)
    assert "✖ aborted" in find_line(lines, "Status")
    assert "analysis latency failed" in find_line(lines, "Aborted")
    assert "0.93 s, needs ≤ 0.46 s (1.2 × A 0.38 s)" in find_line(lines, "ttft p90")
    assert "failed 1/0" in find_line(lines, "ttft p90")
    assert "failed: p90 TTFT 0.93 s > 1.2 x 0.38 s" in find_line(lines, "failed: p90")
    assert " 100%" in find_line(lines, "A chat@r1") and "   0%" in find_line(lines, "B chat@r2")
    assert "red" in str(styled_line(rendered, "Aborted").spans[-1].style)


def test_completed() -> None:
    lines = lines_of(render(completed(), NOW, 80))
    assert "✔ completed · step 6/6" in find_line(lines, "Status")
    assert all("✔" in find_line(lines, text) for _, text in STEP_TEXTS)
    assert "▶" not in "\n".join(lines)
    assert "6/6 steps  100%" in find_line(lines, "Progress")
    assert "█" * 40 in find_line(lines, "Progress") and "░" not in find_line(lines, "Progress")


def test_drifted_engines_in_red_and_waiting_for_gateways() -> None:
    rendered = render(drifted(), NOW, 80)
    lines = lines_of(rendered)
    assert "drifted from its class" in find_line(lines, "Paused")
    assert "✖ drifted on chat@r2: engine-b-1" in "\n".join(lines)
    assert "red" in str(styled_line(rendered, "drifted on").style)
    assert "waiting for gateways" in find_line(lines, "waiting")
    assert "red" in str(next(s.style for s in styled_line(rendered, "B chat@r2").spans if "red" in str(s.style)))


def test_allowed_correctness_change_and_who_paused() -> None:
    lines = lines_of(render(view(phase="paused", pause_reason="PausedByOperator", paused_by="bob",
                                 allow_correctness_change="KV cache dtype bfloat16, quality gate below"), NOW, 80))
    assert "change allowed: KV cache dtype bfloat16" in find_line(lines, "Correctness")
    assert "(by bob)" in find_line(lines, "Paused")


def test_failure_condition_and_quality_not_measured() -> None:
    itl = GateView(analysis="step", template="slo", metric="itl", measure="itl_p99_s", condition="result > 0.5",
                   phase="Running", count=1, successful=1, failed=0, inconclusive=0, error=0, failure_limit=0,
                   latest=measurement("Successful", 0.041, threshold=0.5))
    quality = GateView(analysis="step", template="q", metric="golden", measure="quality", condition="result >= 1",
                       phase="Pending", count=0, successful=0, failed=0, inconclusive=0, error=0, failure_limit=-1,
                       latest=measurement("Inconclusive", None, requests=0, message="not measured"))
    lines = lines_of(render(view(gates=[itl, quality]), NOW, 80))
    assert "0.041 s (fails if > 0.50 s)" in find_line(lines, "itl p99")
    golden = find_line(lines, "quality")
    assert "not measured" in golden and golden.count("not measured") == 1 and "failed 0/off" in golden


def test_wider_terminal_uses_the_width() -> None:
    narrow, wide = lines_of(render(view(), NOW, 80), 80), lines_of(render(view(), NOW, 160), 160)
    assert find_line(wide, "A chat@r1").count("█") > find_line(narrow, "A chat@r1").count("█")
    assert "step latency/ttft" in find_line(wide, "ttft p90")
    assert "bg errors/errors" in find_line(wide, "error rate")
    assert "latency/ttft" not in find_line(narrow, "ttft p90")
    assert all(len(line) <= 160 for line in wide)


def test_a_short_terminal_keeps_the_progress_bar() -> None:
    texts = [("setWeight", f"setWeight {n}") for n in range(5, 100, 5)]
    many = view(steps=steps(8, texts), step_index=8, drifted={"chat@r2": ["engine-b-1"]},
                allow_correctness_change="reason", phase="paused", pause_reason="PausedByOperator")
    lines = lines_of(render(many, NOW, 80, height=24))
    assert len(lines) <= 24
    assert lines[-1].startswith("Progress")
    assert "▶ setWeight 45" in "\n".join(lines)
    assert "earlier step(s) done" in "\n".join(lines) and "more step(s)" in "\n".join(lines)
    assert len(lines_of(render(many, NOW, 80))) > 24  # without a height, everything (up to the step window)


def test_a_refresh_problem_is_shown_first() -> None:
    lines = lines_of(render(view(), NOW, 80, problem="cannot refresh: controller unreachable"))
    assert lines[0] == "⚠ cannot refresh: controller unreachable"


def test_summary_line_is_one_line_without_countdowns() -> None:
    line = summary_line(paused_in_timed_pause())
    assert "\n" not in line
    assert "paused, step 3/6 (pause 2m)" in line and "chat@r2 10% acknowledged" in line
    assert "72" not in line and "1m 12s" not in line  # it changes when the rollout does, not every second
    assert "12 requests < minRequests 20" in summary_line(inconclusive())
    assert "drifted chat@r2: engine-b-1" in summary_line(drifted())


def test_formats() -> None:
    assert [duration(s) for s in (5, 72.4, 3700, 90000)] == ["5s", "1m 12s", "1h 01m", "1d 01h"]
    assert value_text("ttft_p90_s", 0.456) == "0.46 s" and value_text("itl_p50_s", 0.0123) == "0.0123 s"
    assert value_text("error_rate", 0.002) == "0.2%" and value_text("quality", 1.0) == "pass"
    assert value_text("quality", None) == "not measured"


# --- what a view means for the watch ---

def test_outcomes() -> None:
    assert outcome(completed()) is ExitCode.OK
    assert outcome(aborted()) is ExitCode.ROLLOUT_ABORTED
    assert outcome(view()) is None
    assert outcome(inconclusive()) is None and outcome(inconclusive(), exit_on_pause=True) is ExitCode.ROLLOUT_PAUSED
    assert not waits_for_operator(paused_in_timed_pause())  # it ends by itself
    assert outcome(paused_in_timed_pause(), exit_on_pause=True) is None
    assert waits_for_operator(paused_until_promote()) and waits_for_operator(drifted())
    assert outcome(view(phase="aborting"), exit_on_pause=True) is None


# --- the watch loop, scripted ---

class Script:
    """A fetch that answers a list of views (or raises exceptions) in order, and a clock moved only by
    the watch's own sleeps."""

    def __init__(self, answers: list[RolloutView | BaseException]):
        self.answers, self.calls, self.now, self.sleeps = list(answers), 0, 0.0, []

    def fetch(self) -> RolloutView:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def run(script: Script, console: Console | None = None, **options: Any) -> int:
    console = console or Console(width=80, record=True, file=io.StringIO(), color_system=None)
    return watch(script.fetch, console=console, sleep=script.sleep, clock=script.clock, now=lambda: NOW, **options)


def test_returns_0_when_the_rollout_completes(capsys: pytest.CaptureFixture[str]) -> None:
    script = Script([view(), paused_in_timed_pause(), completed()])
    assert run(script, interval_s=2.0) == ExitCode.OK
    assert script.calls == 3 and script.sleeps == [2.0, 2.0]
    assert "rollout #7 completed: all of smollm2-135m's traffic on chat@r2" in capsys.readouterr().err


def test_returns_8_when_the_rollout_aborts(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(Script([view(), view(phase="aborting"), aborted()])) == ExitCode.ROLLOUT_ABORTED
    err = capsys.readouterr().err.strip()
    assert err == "rollout #7 aborted: analysis latency failed: ttft 1 > failureLimit 0; traffic back on chat@r1"


def test_exit_on_pause_returns_9_only_when_an_operator_is_needed(capsys: pytest.CaptureFixture[str]) -> None:
    script = Script([paused_in_timed_pause(), view(), paused_until_promote(), completed()])
    assert run(script, exit_on_pause=True) == ExitCode.ROLLOUT_PAUSED
    assert script.calls == 3
    assert "waits for an operator (fleetctl rollout promote|resume|abort 7)" in capsys.readouterr().err
    assert run(Script([paused_until_promote(), completed()])) == ExitCode.OK  # without the option it waits on


def test_timeout_is_an_error_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    script = Script([view()])
    assert run(script, interval_s=1.0, timeout_s=5.0) == ExitCode.ERROR
    assert script.now == 5.0 and script.calls == 6
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["timed out after 5s: rollout #7 is progressing at step 4/6 (analysis latency); "
                   "it continues (fleetctl rollout status 7)"]


def test_ctrl_c_exits_130_saying_the_rollout_continues(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(Script([view(), KeyboardInterrupt()])) == 130
    err = capsys.readouterr().err
    assert "stopped watching; rollout #7 itself continues (progressing" in err
    assert "Traceback" not in err


def test_an_unreachable_controller_is_shown_and_retried() -> None:
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    script = Script([view(), Unavailable("controller unreachable at http://127.0.0.1:1"),
                     FleetError("database down", status=503), completed()])
    assert run(script, console, interval_s=1.0) == ExitCode.OK
    out = console.export_text()
    assert "cannot refresh: controller unreachable at http://127.0.0.1:1; retrying every 1s" in out
    assert "cannot refresh: database down; retrying every 1s · showing the view from 2s ago" in out
    assert "Traceback" not in out


def test_a_problem_before_the_first_view_is_not_an_outcome() -> None:
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    assert run(Script([Unavailable("connection refused"), completed()]), console) == ExitCode.OK
    assert "cannot refresh: connection refused" in console.export_text()


def test_a_refusal_is_not_retried() -> None:
    script = Script([NotFound("rollout 99 not found")])
    with pytest.raises(NotFound):
        run(script)
    assert script.calls == 1


def test_without_a_terminal_one_line_per_change() -> None:
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    assert run(Script([view(), view(), paused_in_timed_pause(), paused_in_timed_pause(), completed()]), console,
               live=False) == ExitCode.OK
    lines = console.export_text().splitlines()
    assert len(lines) == 3
    assert [line.split(": ", 1)[1].split(",")[0] for line in lines] == ["progressing", "paused", "completed"]


def test_on_a_terminal_the_screen_is_redrawn_in_place() -> None:
    out = io.StringIO()
    console = Console(width=80, height=24, file=out, force_terminal=True, color_system="standard")
    assert run(Script([view(), completed()]), console) == ExitCode.OK
    drawn = out.getvalue()
    assert "\x1b[2K" in drawn and "\x1b[32m" in drawn  # lines erased and redrawn, in colour
    assert "rollout #7 completed" not in drawn  # the ending line goes to stderr, after the screen
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)
    assert "▶ analysis latency" in plain and "6/6 steps  100%" in plain


def test_an_aborted_rollout_shows_the_steps_it_never_ran_and_counts_only_those_done() -> None:
    from rich.console import Console

    from fleetctl.cli.rollout_render import render
    from fleetctl.controller.rollout.view import RolloutView, StepView

    steps = [StepView(index=0, kind="scale", text="scale", status="done"),
             StepView(index=1, kind="setWeight", text="setWeight 20", status="done"),
             StepView(index=2, kind="pause", text="pause 20s", status="not_run"),
             StepView(index=3, kind="setWeight", text="setWeight 100", status="not_run")]
    view = RolloutView(id=2, model="tiny", from_ref="tiny@r2", to_ref="tiny@r1", phase="aborted", step_index=2,
                       steps=steps, weight=0, weights={"tiny@r2": 100.0}, acknowledged=True,
                       ready={"tiny@r2": 2, "tiny@r1": 0}, desired={"tiny@r2": 2, "tiny@r1": 0},
                       abort_reason="aborted by alice", progress=0.5, created_at="2026-12-01T00:00:00+00:00",
                       created_by="alice", updated_at="2026-12-01T00:00:00+00:00", version=3, spec={})
    console = Console(width=80, record=True)
    console.print(render(view, width=80))
    text = console.export_text()
    assert "pause 20s (not run: aborted)" in text and "2/4 steps" in text
