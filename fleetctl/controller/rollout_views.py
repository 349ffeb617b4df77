"""A stored rollout as the API answers it (rollout.view.RolloutView): its spec and state, read together with
what the fleet looks like now (rollout_observations). Pure functions of the row's content, the
observations and the time, except `rollout_view`, which reads the observations."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from fleetctl.controller import rollout_observations
from fleetctl.controller.models import Rollout, RolloutEvent
from fleetctl.controller.rollout.spec import (
    AnalysisStep,
    MetricSpec,
    PauseStep,
    RolloutSpec,
    SetWeightStep,
    step_kind,
)
from fleetctl.controller.rollout.state import (
    ABORTED,
    ABORTING,
    COMPLETED,
    PAUSE_STEP,
    PAUSED,
    AnalysisRun,
    Measurement,
    MetricRun,
    Observations,
    RolloutState,
)
from fleetctl.controller.rollout.view import GateView, MeasurementView, RolloutEventView, RolloutView, StepView


def rollout_view(session: Session, row: Rollout, now: datetime, heard_since: datetime | None = None) -> RolloutView:
    """`heard_since`: when the controller started (the acknowledgement waits as the reconciler's does)."""
    acknowledged = rollout_observations.routing_acknowledged(session, now, heard_since)
    observations = rollout_observations.observe(session, row.model, [row.from_ref, row.to_ref], now, acknowledged)
    return build_view(row, RolloutSpec.model_validate(row.spec), RolloutState.from_json(row.state), observations, now)


def build_view(row: Rollout, spec: RolloutSpec, state: RolloutState, obs: Observations, now: datetime) -> RolloutView:
    refs = (row.from_ref, row.to_ref)
    done = len(spec.steps) if state.phase == COMPLETED else min(state.step_index, len(spec.steps))
    return RolloutView(
        id=row.id, model=row.model, from_ref=row.from_ref, to_ref=row.to_ref, phase=state.phase,
        step_index=state.step_index, steps=step_views(spec, state), weight=state.weight,
        weights=dict(obs.weights), acknowledged=obs.acknowledged,
        ready={ref: obs.ready.get(ref, 0) for ref in refs}, desired={ref: obs.desired.get(ref, 0) for ref in refs},
        drifted={ref: list(engines) for ref, engines in obs.drifted.items() if ref in refs and engines},
        pause_reason=state.pause_reason, paused_by=state.paused_by, pause_left_s=pause_left_s(spec, state, now),
        pause_ends_at=_iso(pause_ends_at(spec, state)),
        abort_reason=state.abort_reason, message=state.message, gates=gate_views(spec, state, now),
        progress=round(done / len(spec.steps), 4),
        allow_correctness_change=spec.allow_correctness_change.reason if spec.allow_correctness_change else None,
        created_at=row.created_at.isoformat(), created_by=row.created_by, updated_at=row.updated_at.isoformat(),
        version=row.version, spec=dict(row.spec),
    )


def step_views(spec: RolloutSpec, state: RolloutState) -> list[StepView]:
    return [StepView(index=i, kind=step_kind(step), text=step_text(step, spec), status=step_status(i, state))
            for i, step in enumerate(spec.steps)]


def step_status(index: int, state: RolloutState) -> str:
    if index < state.step_index:
        return "done"
    if state.phase == COMPLETED:
        return "skipped"  # promoted past it (promote --full)
    if state.phase in (ABORTED, ABORTING):
        return "not_run"  # the rollout was aborted before it
    return "current" if index == state.step_index else "pending"


def step_text(step: object, spec: RolloutSpec) -> str:
    if isinstance(step, SetWeightStep):
        return f"setWeight {step.set_weight}"
    if isinstance(step, PauseStep):
        duration = step.pause.duration
        return "pause (until promote)" if duration is None else f"pause {format_duration(duration)}"
    if isinstance(step, AnalysisStep):
        return "analysis " + ", ".join(step.analysis.templates)
    return f"scale {spec.replicas} engine(s) per role" if spec.replicas else "scale (as many engines as A has)"


def format_duration(seconds: float) -> str:
    """120 -> '2m', 90 -> '90s', 3600 -> '1h'."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def pause_left_s(spec: RolloutSpec, state: RolloutState, now: datetime) -> float | None:
    """Seconds left in the current timed pause step; None when not in one."""
    ends = pause_ends_at(spec, state)
    return None if ends is None else round(max((ends - now).total_seconds(), 0.0), 3)


def pause_ends_at(spec: RolloutSpec, state: RolloutState) -> datetime | None:
    """When the current timed pause step ends; None when not in one."""
    if state.phase != PAUSED or state.pause_reason != PAUSE_STEP or state.step_started_at is None:
        return None
    if state.step_index >= len(spec.steps):
        return None
    step = spec.steps[state.step_index]
    if not isinstance(step, PauseStep) or step.pause.duration is None:
        return None
    return state.step_started_at + timedelta(seconds=step.pause.duration)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def gate_views(spec: RolloutSpec, state: RolloutState, now: datetime) -> list[GateView]:
    runs = [run for run in (state.step_analysis, state.background) if run is not None]
    return [gate_view(run, metric, spec, now) for run in runs for metric in run.metrics]


def gate_view(run: AnalysisRun, metric: MetricRun, spec: RolloutSpec, now: datetime) -> GateView:
    declared = _metric_spec(spec, metric)
    latest = metric.measurements[-1] if metric.measurements else None
    return GateView(
        analysis=run.kind, template=metric.template, metric=metric.name,
        measure=declared.measure if declared else "", condition=_condition(declared), phase=metric.phase,
        count=metric.count, successful=metric.successful, failed=metric.failed, inconclusive=metric.inconclusive,
        error=metric.error, failure_limit=declared.failure_limit if declared else 0,
        latest=measurement_view(latest) if latest else None,
        next_in_s=round(max((metric.next_at - now).total_seconds(), 0.0), 3) if metric.next_at else None,
    )


def _metric_spec(spec: RolloutSpec, metric: MetricRun) -> MetricSpec | None:
    template = spec.templates.get(metric.template)
    return next((m for m in template.metrics if m.name == metric.name), None) if template else None


def _condition(metric: MetricSpec | None) -> str:
    if metric is None:
        return ""
    if metric.success_condition:
        return metric.success_condition
    return f"not ({metric.failure_condition})"


def measurement_view(m: Measurement) -> MeasurementView:
    return MeasurementView(at=m.at.isoformat(), phase=m.phase, value=m.value, baseline=m.baseline,
                           threshold=m.threshold, requests=m.requests, message=m.message)


def event_view(row: RolloutEvent) -> RolloutEventView:
    return RolloutEventView(id=row.id, rollout_id=row.rollout_id, at=row.at.isoformat(), actor=row.actor,
                            event=row.event, message=row.message)
