"""Analysis runs, evaluated purely: `start` a run for some templates, `advance` it over one reconcile's
observations, `stop` it when the rollout no longer needs it. Argo Rollouts' AnalysisRun semantics
(../shared/reference/rollouts.md), measured from the gateways' per-revision counters:

- each metric opens its first window at the first `advance` at or after `started_at + initialDelay` (that call
  only records the counters); a measurement is due `interval` after the window opened (a metric without an
  interval takes its one measurement over DEFAULT_WINDOW_S), and the next window opens where it closed;
- a measurement is B's value over the window (A's too, for a relative condition), classified by the
  conditions: both given, neither holding -> Inconclusive; only a successCondition, not holding -> Failed;
  only a failureCondition, not holding -> Successful. Fewer than `minRequests` requests from B (or from A, for a
  relative condition) -> Inconclusive: a gate never passes for lack of data. `quality` is the golden-set
  canary's verdict for B (pass 1.0, fail 0.0); without one the measurement is an Error ("quality: not
  measured") and is tried again after ERROR_RETRY_S, over the same, still open window;
- a metric's phase follows from its counters (`metric_phase`); the run's phase is its worst metric's in
  PHASE_ORDER, and a terminal run is never advanced again.

`count`: without one, 1 when there is no interval; with an interval, unlimited (background) until `stop`.
`count: 0` is unlimited in a background run and, in a step, means the metric never runs (Argo): it counts
as Successful without a measurement, and its message says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Literal

from fleetctl.controller.rollout.spec import QUALITY, AnalysisTemplate, Condition, MetricSpec, RolloutSpec
from fleetctl.controller.rollout.state import (
    ERROR, FAILED, INCONCLUSIVE_PHASE, PENDING, PHASE_ORDER, RUNNING, SUCCESSFUL, AnalysisRun, Measurement, MetricRun,
    Observations, ServedByGateway, ServedCounters,
)
from fleetctl.controller.rollout.window import error_rate, quantile, rejection_rate, window_delta

DEFAULT_WINDOW_S = 30.0  # the window of a metric that has no interval (it measures once)
ERROR_RETRY_S = 10.0  # after an Error measurement, the next try (Argo's DefaultErrorRetryInterval)
RETENTION = 10  # measurements kept per metric, newest last (Argo's default measurementRetention)
TERMINAL_PHASES = (SUCCESSFUL, FAILED, ERROR, INCONCLUSIVE_PHASE)
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}

Kind = Literal["step", "background"]


def start(templates: Mapping[str, AnalysisTemplate], names: Sequence[str], kind: Kind, step_index: int | None,
          now: datetime) -> AnalysisRun:
    """A new run of the named templates' metrics, each Pending until its initialDelay has passed."""
    metrics = tuple(
        _start_metric(metric, name, kind, now) for name in names for metric in templates[name].metrics)
    return _with_phase(AnalysisRun(kind=kind, step_index=step_index, started_at=now, metrics=metrics))


def advance(run: AnalysisRun, templates: Mapping[str, AnalysisTemplate], observations: Observations,
            baseline_ref: str, canary_ref: str, now: datetime) -> AnalysisRun:
    """Open the windows and take the measurements that are due at `now`; recompute the phases."""
    if run.phase in TERMINAL_PHASES:
        return run
    metrics = tuple(
        _advance_metric(m, _spec(templates, m), run.kind, observations, baseline_ref, canary_ref, now)
        for m in run.metrics)
    return _with_phase(replace(run, metrics=metrics))


def stop(run: AnalysisRun, message: str = "stopped") -> AnalysisRun:
    """Terminate a run (the rollout finished or moved past it): metrics still going end Successful; one that
    already broke a limit keeps its phase (Argo's terminate)."""
    if run.phase in TERMINAL_PHASES:
        return run
    metrics = tuple(m if m.phase in TERMINAL_PHASES else replace(m, phase=SUCCESSFUL, next_at=None)
                    for m in run.metrics)
    return replace(_with_phase(replace(run, metrics=metrics)), message=message)


def next_due(run: AnalysisRun) -> datetime | None:
    """When the run next needs an `advance`: its earliest pending window opening or measurement."""
    if run.phase in TERMINAL_PHASES:
        return None
    due = [m.next_at for m in run.metrics if m.phase not in TERMINAL_PHASES and m.next_at is not None]
    return min(due) if due else None


def quality_unavailable(spec: RolloutSpec, observations: Observations) -> str | None:
    """Why a spec cannot start (None: it can): it measures `quality` and no golden-set canary gives any
    revision a verdict, so the gate could only ever report `quality: not measured`."""
    if not spec.requires_quality():
        return None
    if any(verdict is not None for verdict in observations.quality.values()):
        return None
    return ("quality: not measured (no golden-set canary verdict for any revision); a spec whose analysis "
            "measures quality cannot start until the canary runs")


def metric_phase(metric: MetricRun, spec: MetricSpec, kind: Kind) -> str:
    """Argo's assessMetricStatus over the counters, in its order: failed > failureLimit (unless -1), then
    inconclusive > inconclusiveLimit, then consecutive errors > consecutiveErrorLimit, then count reached.
    A count reached without one successful measurement is Inconclusive, never a pass."""
    if spec.failure_limit >= 0 and metric.failed > spec.failure_limit:
        return FAILED
    if metric.inconclusive > spec.inconclusive_limit:
        return INCONCLUSIVE_PHASE
    if metric.consecutive_error > spec.consecutive_error_limit:
        return ERROR
    count = effective_count(spec, kind)
    if count == 0 and kind == "step":
        return SUCCESSFUL
    if count is not None and metric.count >= count:
        return SUCCESSFUL if metric.successful > 0 else INCONCLUSIVE_PHASE
    return RUNNING if metric.window_start is not None else PENDING


def effective_count(spec: MetricSpec, kind: Kind) -> int | None:
    """Measurements to take; None: unlimited (until the run is stopped)."""
    if spec.count is None:
        return 1 if spec.interval is None else None
    if spec.count == 0:
        return None if kind == "background" else 0
    return spec.count


def run_phase(metrics: Sequence[MetricRun]) -> str:
    """The worst metric phase (Successful < Running < Pending < Inconclusive < Error < Failed)."""
    if not metrics:
        return SUCCESSFUL
    return max((m.phase for m in metrics), key=PHASE_ORDER.index)


# --- one metric ---

def _start_metric(metric: MetricSpec, template: str, kind: Kind, now: datetime) -> MetricRun:
    run = MetricRun(name=metric.name, template=template, next_at=now + timedelta(seconds=metric.initial_delay))
    if effective_count(metric, kind) == 0:
        return replace(run, phase=SUCCESSFUL, next_at=None)
    return run


def _spec(templates: Mapping[str, AnalysisTemplate], metric: MetricRun) -> MetricSpec:
    return next(m for m in templates[metric.template].metrics if m.name == metric.name)


def _advance_metric(metric: MetricRun, spec: MetricSpec, kind: Kind, observations: Observations, a: str, b: str,
                    now: datetime) -> MetricRun:
    if metric.phase in TERMINAL_PHASES or metric.next_at is None or now < metric.next_at:
        return metric
    if metric.window_start is None:
        opened = replace(metric, window_start=observations.served, window_started_at=now,
                         next_at=now + timedelta(seconds=_window_s(spec)))
        return replace(opened, phase=metric_phase(opened, spec, kind))
    measurement = measure(spec, metric.window_start, observations, a, b, now)
    counted = _count(metric, measurement)
    if measurement.phase == ERROR:
        counted = replace(counted, next_at=now + timedelta(seconds=ERROR_RETRY_S))  # the window stays open
    else:
        counted = replace(counted, window_start=observations.served, window_started_at=now,
                          next_at=now + timedelta(seconds=_window_s(spec)))
    phase = metric_phase(counted, spec, kind)
    return replace(counted, phase=phase, next_at=None if phase in TERMINAL_PHASES else counted.next_at)


def _window_s(spec: MetricSpec) -> float:
    return spec.interval if spec.interval is not None else DEFAULT_WINDOW_S


def _count(metric: MetricRun, m: Measurement) -> MetricRun:
    """Argo's counters: an Error is not a measurement taken (count stays), and any other outcome ends an error
    streak."""
    kept = (metric.measurements + (m,))[-RETENTION:]
    if m.phase == ERROR:
        return replace(metric, error=metric.error + 1, consecutive_error=metric.consecutive_error + 1,
                       measurements=kept)
    counts = {SUCCESSFUL: "successful", FAILED: "failed", INCONCLUSIVE_PHASE: "inconclusive"}
    field = counts[m.phase]
    return replace(metric, count=metric.count + 1, consecutive_error=0, measurements=kept,
                   **{field: getattr(metric, field) + 1})


# --- one measurement ---

def measure(spec: MetricSpec, window_start: ServedByGateway, observations: Observations, a: str, b: str,
            now: datetime) -> Measurement:
    """B's value over the window since `window_start` (and A's, when a condition is relative), classified."""
    success, failure = spec.conditions()
    relative = any(c is not None and c.relative for c in (success, failure))
    if spec.measure == QUALITY:
        return _quality(spec, observations, a, b, success, failure, now)
    delta = window_delta(window_start, observations.served)
    canary, baseline = delta.get(b, ServedCounters()), delta.get(a, ServedCounters())
    few = _too_few(spec, canary, baseline, relative, a, b)
    if few is not None:
        return Measurement(at=now, phase=INCONCLUSIVE_PHASE, value=None, baseline=None, threshold=None,
                           requests=canary.requests, message=few)
    value = _value(spec.measure, canary)
    base = _value(spec.measure, baseline) if relative else None
    if value is None or (relative and base is None):
        who = b if value is None else a
        return Measurement(at=now, phase=INCONCLUSIVE_PHASE, value=value, baseline=base, threshold=None,
                           requests=canary.requests, message=f"{spec.measure}: nothing observed for {who}")
    return _classify(spec.measure, value, base, success, failure, now, canary.requests)


def _quality(spec: MetricSpec, observations: Observations, a: str, b: str, success: Condition | None,
             failure: Condition | None, now: datetime) -> Measurement:
    verdicts = {"pass": 1.0, "fail": 0.0}
    value = verdicts.get(observations.quality.get(b) or "")
    relative = any(c is not None and c.relative for c in (success, failure))
    base = verdicts.get(observations.quality.get(a) or "") if relative else None
    if value is None or (relative and base is None):
        who = b if value is None else a
        return Measurement(at=now, phase=ERROR, value=None, baseline=None, threshold=None, requests=0,
                           message=f"quality: not measured for {who}")
    return _classify(QUALITY, value, base, success, failure, now, 0)


def _too_few(spec: MetricSpec, canary: ServedCounters, baseline: ServedCounters, relative: bool, a: str,
             b: str) -> str | None:
    if canary.requests < spec.min_requests:
        return f"{b}: {canary.requests} requests < minRequests {spec.min_requests}"
    if relative and baseline.requests < spec.min_requests:
        return f"{a} (baseline): {baseline.requests} requests < minRequests {spec.min_requests}"
    return None


def _value(measure: str, c: ServedCounters) -> float | None:
    if measure == "error_rate":
        return error_rate(c)
    if measure == "rejection_rate":
        return rejection_rate(c)
    family, level = measure.split("_")[:2]  # ttft_p90_s -> ttft, p90
    return quantile(c.ttft if family == "ttft" else c.itl, QUANTILES[level])


def _classify(measure: str, value: float, base: float | None, success: Condition | None,
              failure: Condition | None, now: datetime, requests: int) -> Measurement:
    """Argo's evaluate: with both conditions, failure first, then success, else Inconclusive; with only one,
    a measurement that does not meet it is the other outcome."""
    failed = failure.holds(value, base) if failure is not None else None
    passed = success.holds(value, base) if success is not None else None
    if failed:
        phase, shown, holds = FAILED, failure, True
    elif failure is None and passed is False:
        phase, shown, holds = FAILED, success, False
    elif passed:
        phase, shown, holds = SUCCESSFUL, success, True
    elif success is None and failed is False:
        phase, shown, holds = SUCCESSFUL, failure, False
    else:
        phase, shown, holds = INCONCLUSIVE_PHASE, success or failure, False
    assert shown is not None  # the spec guarantees one condition at least
    threshold = shown.threshold(base)
    return Measurement(at=now, phase=phase, value=value, baseline=base, threshold=threshold, requests=requests,
                       message=_message(measure, value, shown, threshold, holds, phase))


def _message(measure: str, value: float, condition: Condition, threshold: float | None, holds: bool,
             phase: str) -> str:
    """"ttft_p90_s 0.41 <= 1.2 x baseline (0.456): Successful"."""
    rhs = f"{condition.factor:g} x baseline ({threshold:.4g})" if condition.relative else f"{threshold:.4g}"
    return f"{measure} {value:.4g} {'' if holds else 'not '}{condition.op} {rhs}: {phase}"


def _with_phase(run: AnalysisRun) -> AnalysisRun:
    phase = run_phase(run.metrics)
    message = run.message
    if phase in TERMINAL_PHASES:
        message = _run_message(run.metrics, phase)
    return replace(run, phase=phase, message=message)


def _run_message(metrics: Sequence[MetricRun], phase: str) -> str:
    """The one line an operator reads: the deciding metric and its latest measurement."""
    deciding = next((m for m in metrics if m.phase == phase), None)
    if deciding is None:
        return phase
    latest = deciding.measurements[-1].message if deciding.measurements else "no measurement"
    if phase == SUCCESSFUL and not deciding.measurements:
        latest = "count 0: not measured in a step"
    return f"{deciding.template}/{deciding.name} {phase}: {latest}"
