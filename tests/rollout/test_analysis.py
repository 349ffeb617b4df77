"""fleetctl.controller.rollout.analysis: windows, measurements and Argo's phase rules, over hand-made
counter snapshots and a hand-moved clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fleetctl.controller.rollout import analysis
from fleetctl.controller.rollout.spec import AnalysisTemplate
from fleetctl.controller.rollout.state import (
    ERROR, FAILED, INCONCLUSIVE_PHASE, PENDING, RUNNING, SUCCESSFUL, AnalysisRun, Observations, RolloutState,
    ServedCounters,
)
from tests.rollout.world import A, B, T0, make_spec, served


def template(**metric: Any) -> dict[str, AnalysisTemplate]:
    base = {"name": "m", "measure": "ttft_p90_s", "successCondition": "result <= 0.5", "interval": "10s",
            "count": 3, "minRequests": 10}
    return {"t": AnalysisTemplate.model_validate({"metrics": [{**base, **metric}]})}


def observe(a: ServedCounters, b: ServedCounters, quality: dict[str, str | None] | None = None) -> Observations:
    return Observations(weights={A: 50, B: 50}, acknowledged=True, ready={}, desired={}, drifted={},
                        served={"gw": {A: a, B: b}}, quality=quality or {})


class Clock:
    """Drives one run: each window B (and A) serve `requests` more at the latencies given."""

    def __init__(self, templates: dict[str, AnalysisTemplate], kind: str = "step") -> None:
        self.templates, self.now = templates, T0
        self.a, self.b = ServedCounters(), ServedCounters()
        self.run = analysis.start(templates, list(templates), kind, 2, T0)  # type: ignore[arg-type]
        self.run = self.advance()  # opens the windows

    def advance(self, quality: dict[str, str | None] | None = None) -> AnalysisRun:
        self.run = analysis.advance(self.run, self.templates, observe(self.a, self.b, quality), A, B, self.now)
        return self.run

    def window(self, b_requests: int = 50, b_ttft: float = 0.08, a_requests: int = 50, a_ttft: float = 0.08,
               b_errors: int = 0, seconds: float = 10, quality: dict[str, str | None] | None = None) -> AnalysisRun:
        from tests.rollout.world import add
        self.a = add(self.a, served(a_requests, ttft=a_ttft))
        self.b = add(self.b, served(b_requests, b_errors, ttft=b_ttft))
        self.now += timedelta(seconds=seconds)
        return self.advance(quality)

    @property
    def metric(self):  # noqa: ANN201 - the one metric of these tests
        return self.run.metrics[0]


def test_the_first_advance_only_opens_the_window() -> None:
    clock = Clock(template())
    assert clock.metric.phase == RUNNING and clock.metric.count == 0 and clock.metric.window_start is not None
    assert analysis.next_due(clock.run) == T0 + timedelta(seconds=10)
    clock.now += timedelta(seconds=9)
    assert clock.advance() == clock.run and clock.metric.count == 0  # not due yet


def test_initial_delay_holds_the_window_back() -> None:
    clock = Clock(template(initialDelay="30s"))
    assert clock.metric.phase == PENDING and clock.metric.window_start is None
    assert analysis.next_due(clock.run) == T0 + timedelta(seconds=30)
    clock.now += timedelta(seconds=30)
    assert clock.advance().metrics[0].phase == RUNNING


def test_absolute_condition_passes_and_count_reached_is_successful() -> None:
    clock = Clock(template())
    for _ in range(2):
        assert clock.window(b_ttft=0.2).phase == RUNNING
    run = clock.window(b_ttft=0.2)
    assert run.phase == SUCCESSFUL and clock.metric.successful == 3
    latest = clock.metric.measurements[-1]
    assert latest.threshold == 0.5 and latest.value is not None and latest.value <= 0.5 and latest.requests == 50
    assert analysis.next_due(run) is None


def test_only_a_success_condition_not_met_is_a_failure() -> None:
    clock = Clock(template())
    run = clock.window(b_ttft=0.8)
    assert run.phase == FAILED and clock.metric.failed == 1
    assert "not <= 0.5" in clock.metric.measurements[-1].message and "t/m Failed" in run.message


def test_relative_condition_compares_with_a_over_the_same_window() -> None:
    relative = template(successCondition="result <= 1.2 * baseline", count=1)
    good = Clock(relative)
    assert good.window(b_ttft=0.09, a_ttft=0.08).phase == SUCCESSFUL
    m = good.metric.measurements[-1]
    assert m.baseline is not None and m.threshold == 1.2 * m.baseline
    bad = Clock(relative)
    assert bad.window(b_ttft=0.4, a_ttft=0.08).phase == FAILED


def test_too_few_requests_from_b_is_inconclusive_never_a_pass() -> None:
    clock = Clock(template(count=1))
    run = clock.window(b_requests=9, b_ttft=0.01)
    assert run.phase == INCONCLUSIVE_PHASE and clock.metric.successful == 0
    assert "9 requests < minRequests 10" in clock.metric.measurements[-1].message


def test_too_few_requests_from_a_is_inconclusive_for_a_relative_condition_only() -> None:
    relative = Clock(template(successCondition="result <= 2 * baseline", count=1))
    assert relative.window(a_requests=3).phase == INCONCLUSIVE_PHASE
    assert "baseline" in relative.metric.measurements[-1].message
    absolute = Clock(template(count=1))
    assert absolute.window(a_requests=3).phase == SUCCESSFUL


def test_both_conditions_and_neither_holds_is_inconclusive() -> None:
    clock = Clock(template(successCondition="result <= 0.1", failureCondition="result > 0.9", count=1))
    assert clock.window(b_ttft=0.4).phase == INCONCLUSIVE_PHASE


def test_only_a_failure_condition_not_met_is_a_success() -> None:
    clock = Clock(template(successCondition=None, failureCondition="result > 0.05", measure="error_rate", count=1))
    assert clock.window(b_errors=1).phase == SUCCESSFUL
    clock = Clock(template(successCondition=None, failureCondition="result > 0.05", measure="error_rate", count=1))
    assert clock.window(b_errors=10).phase == FAILED


def test_failure_limit_allows_that_many_failures() -> None:
    clock = Clock(template(failureLimit=1, count=5))
    assert clock.window(b_ttft=0.8).phase == RUNNING
    assert clock.window(b_ttft=0.2).phase == RUNNING
    assert clock.window(b_ttft=0.8).phase == FAILED and clock.metric.failed == 2


def test_failure_limit_minus_one_never_fails() -> None:
    clock = Clock(template(failureLimit=-1, count=3))
    for _ in range(2):
        clock.window(b_ttft=0.8)
    assert clock.window(b_ttft=0.2).phase == SUCCESSFUL and clock.metric.failed == 2


def test_inconclusive_limit() -> None:
    clock = Clock(template(inconclusiveLimit=1, count=3))
    assert clock.window(b_requests=1).phase == RUNNING
    assert clock.window(b_requests=1).phase == INCONCLUSIVE_PHASE


def test_count_reached_without_one_success_is_inconclusive() -> None:
    clock = Clock(template(inconclusiveLimit=5, count=2))
    clock.window(b_requests=1)
    assert clock.window(b_requests=1).phase == INCONCLUSIVE_PHASE and clock.metric.count == 2


def test_quality_not_measured_is_an_error_retried_then_the_metric_errors() -> None:
    clock = Clock(template(measure="quality", successCondition="result >= 1", consecutiveErrorLimit=2, count=2))
    for expected in (RUNNING, RUNNING, ERROR):
        assert clock.window(quality={B: None}).phase == expected
    m = clock.metric
    assert (m.error, m.consecutive_error, m.count) == (3, 3, 0)  # an error is not a measurement taken
    assert m.measurements[-1].message == f"quality: not measured for {B}"


def test_an_error_waits_the_retry_interval_and_a_measurement_ends_the_streak() -> None:
    clock = Clock(template(measure="quality", successCondition="result >= 1", count=2))
    clock.window(quality={B: None})
    assert analysis.next_due(clock.run) == clock.now + timedelta(seconds=analysis.ERROR_RETRY_S)
    run = clock.window(quality={B: "pass"})
    assert run.phase == RUNNING and clock.metric.consecutive_error == 0 and clock.metric.successful == 1
    assert clock.window(quality={B: "fail"}).phase == FAILED


def test_measurements_are_kept_ten_deep() -> None:
    clock = Clock(template(count=None))  # interval, no count: runs until stopped
    for _ in range(14):
        clock.window()
    assert clock.metric.count == 14 and len(clock.metric.measurements) == analysis.RETENTION
    assert clock.metric.measurements[-1].at == clock.now
    stopped = analysis.stop(clock.run)
    assert stopped.phase == SUCCESSFUL and analysis.next_due(stopped) is None


def test_stop_keeps_a_broken_limit() -> None:
    clock = Clock(template(count=None))
    clock.window(b_ttft=0.8)
    assert analysis.stop(clock.run).phase == FAILED


def test_the_run_is_its_worst_metric() -> None:
    templates = {"t": AnalysisTemplate.model_validate({"metrics": [
        {"name": "fast", "measure": "ttft_p90_s", "successCondition": "result <= 0.5", "minRequests": 10},
        {"name": "slow", "measure": "itl_p90_s", "successCondition": "result <= 0.5", "interval": "10s",
         "count": 3, "minRequests": 10}]})}
    clock = Clock(templates)
    clock.now += timedelta(seconds=analysis.DEFAULT_WINDOW_S - 10)
    run = clock.window()
    assert [m.phase for m in run.metrics] == [SUCCESSFUL, RUNNING] and run.phase == RUNNING
    run = clock.window(b_ttft=0.8)
    assert run.phase == RUNNING  # the one-shot metric already passed; ttft no longer measured
    assert analysis.run_phase(run.metrics[:1]) == SUCCESSFUL


def test_count_zero_never_runs_in_a_step_and_runs_forever_in_the_background() -> None:
    step = Clock(template(count=0))
    assert step.run.phase == SUCCESSFUL and "count 0" in step.run.message and step.metric.count == 0
    background = Clock(template(count=0), kind="background")
    for _ in range(3):
        background.window()
    assert background.run.phase == RUNNING and background.metric.count == 3


def test_quality_unavailable_refuses_a_quality_spec_without_a_canary() -> None:
    quality = {"q": {"metrics": [{"name": "q", "measure": "quality", "successCondition": "result >= 1"}]}}
    spec = make_spec([{"analysis": {"templates": ["q"]}}], templates=quality)
    none = observe(ServedCounters(), ServedCounters(), {A: None})
    assert "quality: not measured" in (analysis.quality_unavailable(spec, none) or "")
    assert analysis.quality_unavailable(spec, observe(ServedCounters(), ServedCounters(), {A: "pass"})) is None
    assert analysis.quality_unavailable(make_spec([{"setWeight": 10}]), none) is None


def test_a_run_survives_the_stores_json_round_trip() -> None:
    clock = Clock(template(count=5, inconclusiveLimit=2))
    clock.window()
    clock.window(b_requests=2)
    state = RolloutState(step_index=2, step_started_at=T0, step_analysis=clock.run, background=clock.run)
    again = RolloutState.from_json(state.to_json())
    assert again == state
    clock.run = again.step_analysis  # and it keeps measuring from the stored window
    assert clock.window().metrics[0].count == 3
