"""The rollout state machine: `step(spec, state, observations, now, from_ref, to_ref) -> Transition`, pure
(no I/O, no clock: `now` is a parameter). The reconciler, on the leader, reads the observations, calls
`step`, stores `transition.state` together with its `Record` actions (one transaction, under the rollout's
version check), applies the other actions in order, and looks again after `requeue_after_s`.

Level-based: every decision is taken from the stored state and what the fleet looks like now, never from
"what I did last time". The world actions (SetWeights, ScaleUp, Drain) are idempotent and re-emitted for as
long as the fleet does not show their effect, so a crash at any point (actions applied but the state lost,
or the state stored but actions lost) continues where it was: no step repeats, none is skipped
(tests/rollout/test_crash_properties.py drives both kinds of crash). Store first, then apply: a crash then
loses only actions, which the next tick re-emits; applying first is safe too, but a lost transition can
briefly undo the fleet's progress (the next tick re-emits the older step's weights).

A = `from_ref` (the revision traffic moves from), B = `to_ref`. Per tick:

1. A break-glass freeze holds every non-terminal rollout (`paused_by` "freeze"; it resumes when the freeze
   lifts, unless an operator paused it too); an operator's pause holds it until `resume`/`promote`. Held,
   nothing moves and nothing is measured (the open windows just grow); a timed pause's clock keeps running.
2. Aborting: weights {A: 100} until stored and acknowledged by every gateway, then Drain(B) until B's
   deployments ask for nothing, then `aborted`.
3. Otherwise, when the spec measures no `quality` and the canary says B fails (its answers drift from the
   reference), the rollout aborts. Else the background analysis (from `analysis.startingStep`) advances: Failed/Error aborts,
   Inconclusive pauses (InconclusiveAnalysisRun). Then the steps, as many as are done at once:
   - `scale`: ScaleUp(B) until B's engines are all ready (ready >= desired > 0, every role);
   - `setWeight N`: SetWeights {A: 100-N, B: N}; done when the stored policy has them and every gateway
     acknowledged. A weight above 0 waits for B's engines (B is scaled first even when the spec has no
     `scale` step: the implicit scale) and is blocked (EngineConfigDrift) while an engine of B is drifted;
   - `pause`: timed (done at step start + duration) or until `promote` (CanaryPauseStep);
   - `analysis`: an inline run; Successful -> next step, Failed/Error -> abort, Inconclusive -> pause until
     `promote` (which skips the step) or `abort`.
4. After the last step the background analysis is stopped (Successful unless it broke a limit); then
   weights {B: 100} (the same implicit scale and drift guard), acknowledged, then Drain(A) until A's
   deployments ask for nothing; `completed`.

A step is entered when `step_started_at` is None (Record step_started, the step's clock starts) and left
with Record step_done (`step_index` + 1, `step_started_at` None). History events (`Record.event`):
step_started, step_done, weights, scale, analysis, paused, resumed, aborting, aborted, completed, skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from fleetctl.controller.rollout import analysis
from fleetctl.controller.rollout.commands import CommandRefused, abort, aborting, pause, promote, resume, retry
from fleetctl.controller.rollout.spec import (
    AnalysisStep, PauseStep, RolloutSpec, ScaleUpStep, SetWeightStep, Step, step_kind,
)
from fleetctl.controller.rollout.state import (
    ABORTED, ABORTING, BREAK_GLASS, COMPLETED, DRIFT, ERROR, FAILED, FREEZE, HOLD_REASONS, INCONCLUSIVE,
    INCONCLUSIVE_PHASE, PAUSE_STEP, PAUSED, PIN, PROGRESSING, SUCCESSFUL, TERMINAL, Action, AnalysisRun, Drain,
    Observations, PauseReason, Record, RolloutState, ScaleUp, SetWeights, Transition,
)

__all__ = ["CommandRefused", "abort", "describe_step", "pause", "promote", "resume", "retry", "step",
           "weights_are"]

WAIT_S = 1.0  # requeue while waiting for acknowledgements, engines or drains
DRIFT_POLL_S = 5.0  # requeue while a step is blocked by drift
FREEZE_POLL_S = 5.0  # requeue while frozen (the freeze lifting is only seen by looking)


def step(spec: RolloutSpec, state: RolloutState, observations: Observations, now: datetime, from_ref: str,
         to_ref: str, replicas: int = 1) -> Transition:
    """One reconcile of one rollout. `replicas`: B's engines per role when the spec does not say (the
    controller passes A's)."""
    tick = _Tick(spec, observations, now, from_ref, to_ref, spec.replicas or replicas, state)
    if state.phase not in TERMINAL and not _held(tick):
        if tick.state.phase == ABORTING:
            _aborting(tick)
        else:
            _progressing(tick)
    return tick.transition(state)


def describe_step(step: Step) -> str:
    """The step in one line: "setWeight 10", "pause 2m", "pause (until promote)", "analysis latency", "scale"."""
    if isinstance(step, SetWeightStep):
        return f"setWeight {step.set_weight}"
    if isinstance(step, PauseStep):
        seconds = step.pause.duration
        return "pause (until promote)" if seconds is None else f"pause {_duration(seconds)}"
    if isinstance(step, AnalysisStep):
        return "analysis " + ", ".join(step.analysis.templates)
    return step_kind(step)


def weights_are(weights: Mapping[str, float], target: Mapping[str, float]) -> bool:
    """Whether a stored policy sends traffic as `target` does (weights are relative; zeros are absent)."""
    got, want = _shares(weights), _shares(target)
    return got.keys() == want.keys() and all(abs(got[ref] - want[ref]) < 1e-9 for ref in want)


# --- one tick's working state (local to `step`; the function stays pure) ---

@dataclass
class _Tick:
    spec: RolloutSpec
    obs: Observations
    now: datetime
    a: str
    b: str
    replicas: int
    state: RolloutState
    actions: list[Action] = field(default_factory=list)
    requeue: float | None = None
    pause: tuple[PauseReason, str] | None = None  # the pause the current step (or background run) asks for

    def update(self, **changes: object) -> None:
        self.state = self.state.but(**changes)

    def emit(self, action: Action) -> None:
        self.actions.append(action)

    def record(self, event: str, message: str, step: int | None = None) -> None:
        self.actions.append(Record(event, message, step))

    def wake(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def wake_at(self, when: datetime | None) -> None:
        if when is not None:
            self.wake((when - self.now).total_seconds())

    def transition(self, before: RolloutState) -> Transition:
        records = [a for a in self.actions if isinstance(a, Record)]
        if records:
            self.update(message=records[-1].message)
        if self.state != before:
            self.update(updated_at=self.now)
        return Transition(self.state, tuple(self.actions), self.requeue)

    @property
    def allow(self) -> bool:
        return self.spec.allow_correctness_change is not None


# --- holds: freeze and operator ---

def _held(t: _Tick) -> bool:
    """Apply or lift a break-glass hold (a freeze, else a pin of the model); True while one or an operator
    holds the rollout."""
    s = t.state
    holder = FREEZE if t.obs.frozen else PIN if t.obs.pinned else None
    if s.paused_by in BREAK_GLASS and s.paused_by != holder:
        t.update(paused_by=None, pause_reason=None if s.pause_reason in HOLD_REASONS.values() else s.pause_reason)
        t.record("resumed", f"the {s.paused_by} lifted", s.step_index)
        s = t.state
    if holder is not None and s.paused_by is None:
        t.update(paused_by=holder, pause_reason=s.pause_reason or HOLD_REASONS[holder],
                 phase=ABORTING if s.phase == ABORTING else PAUSED)
        t.record("paused", _HOLD_MESSAGES[holder], s.step_index)
    if holder is not None:
        t.wake(FREEZE_POLL_S)
    return t.state.paused_by is not None


_HOLD_MESSAGES = {
    FREEZE: "frozen (break-glass freeze or the rollout_automation flag off): the rollout waits for it to lift",
    PIN: "the model is pinned to one class revision (break-glass pin): the rollout waits for the unpin",
}


# --- abort and completion ---

def _begin_abort(t: _Tick, reason: str) -> None:
    t.state = aborting(t.state, reason, t.now)
    t.record("aborting", f"aborting: {reason}", t.state.step_index)


def _aborting(t: _Tick) -> None:
    target = {t.a: 100.0, t.b: 0.0}
    if not weights_are(t.obs.weights, target):
        t.emit(SetWeights(target, t.allow))
        t.wake(WAIT_S)
    elif not t.obs.acknowledged:
        t.wake(WAIT_S)
    elif t.obs.desired.get(t.b, 0) > 0:
        t.emit(Drain(t.b))  # only once every gateway routes to A: nothing is sent to an engine that drains
        t.wake(WAIT_S)
    else:
        t.update(phase=ABORTED, pause_reason=None)
        t.record("aborted", f"all traffic on {t.a}, {t.b} drained: {t.state.abort_reason}", t.state.step_index)


def _finish(t: _Tick) -> None:
    if not _move_traffic(t, 100):
        return
    if t.obs.desired.get(t.a, 0) > 0:
        t.emit(Drain(t.a))
        t.wake(WAIT_S)
        return
    t.update(phase=COMPLETED, pause_reason=None)
    t.record("completed", f"all traffic on {t.b}; {t.a} drained")


# --- progressing ---

def _progressing(t: _Tick) -> None:
    if _canary_alarmed(t):
        _aborting(t)
        return
    _run_background(t)
    if t.state.phase != ABORTING and t.pause is None:
        _skip_to_end_if_promoted(t)
        _run_steps(t)
    if t.state.phase == ABORTING:
        _aborting(t)
        return
    _start_background(t)
    _settle_pause(t)


def _canary_alarmed(t: _Tick) -> bool:
    """A spec without a quality metric still aborts when the canary says B's answers drift or fail: an alarm is
    already a sequential test's decision. A spec that measures quality leaves it to that metric's limits."""
    if t.spec.requires_quality() or t.obs.quality.get(t.b) != "fail":
        return False
    _begin_abort(t, f"the quality canary: {t.b}'s answers drift from the golden set's reference")
    return True


def _run_steps(t: _Tick) -> None:
    """As many steps as are done now, in order; the loop stops at the first that is not."""
    for _ in range(len(t.spec.steps) + 1):
        if t.state.step_index >= len(t.spec.steps):
            _stop_background(t)
            if t.pause is None:
                _finish(t)
            return
        if not _run_step(t):
            return


def _run_step(t: _Tick) -> bool:
    index = t.state.step_index
    current = t.spec.steps[index]
    if t.state.step_started_at is None:
        _enter(t, index, current)
    done = _STEP_HANDLERS[type(current)](t, current)
    if not done or t.state.phase == ABORTING:
        return False
    t.record("step_done", f"step {index} ({describe_step(current)}) done", index)
    t.update(step_index=index + 1, step_started_at=None, step_analysis=None)
    return True


def _enter(t: _Tick, index: int, current: Step) -> None:
    t.update(step_started_at=t.now)
    t.record("step_started", f"step {index} ({describe_step(current)}) started", index)
    if isinstance(current, AnalysisStep):
        run = analysis.start(t.spec.templates, current.analysis.templates, "step", index, t.now)
        if run.phase in analysis.TERMINAL_PHASES:  # every metric has count 0: it never runs in a step
            t.record("analysis", f"step {index} analysis {run.phase}: {run.message}", index)
        t.update(step_analysis=run)


def _settle_pause(t: _Tick) -> None:
    """The phase follows from the pause asked for this tick; entering a pause is recorded once."""
    if t.state.phase in TERMINAL or t.state.phase == ABORTING:
        return
    if t.pause is None:
        t.update(phase=PROGRESSING, pause_reason=None)
        return
    reason, message = t.pause
    if t.state.pause_reason != reason:
        t.record("paused", message, t.state.step_index)
    t.update(phase=PAUSED, pause_reason=reason)


def _skip_to_end_if_promoted(t: _Tick) -> None:
    count = len(t.spec.steps)
    if t.state.promote_full and t.state.step_index < count:
        t.record("skipped", f"steps {t.state.step_index}..{count - 1} skipped (promote --full)", t.state.step_index)
        t.update(step_index=count, step_started_at=None, step_analysis=None)


# --- the step types ---

def _scale(t: _Tick, _: ScaleUpStep) -> bool:
    return _ensure_b_ready(t)


def _set_weight(t: _Tick, current: SetWeightStep) -> bool:
    return _move_traffic(t, current.set_weight)


def _pause(t: _Tick, current: PauseStep) -> bool:
    index, duration = t.state.step_index, current.pause.duration
    if duration is None:
        t.pause = (PAUSE_STEP, f"paused at step {index}: waits for promote")
        return False
    assert t.state.step_started_at is not None  # entered before it runs
    ends = t.state.step_started_at + timedelta(seconds=duration)
    if t.now >= ends:
        return True
    t.pause = (PAUSE_STEP, f"paused at step {index} for {_duration(duration)}")
    t.wake_at(ends)
    return False


def _analysis_step(t: _Tick, current: AnalysisStep) -> bool:
    index = t.state.step_index
    run = t.state.step_analysis
    if run is None:  # a state stored by hand or by an older version: start it now
        run = analysis.start(t.spec.templates, current.analysis.templates, "step", index, t.now)
    run = _advance(t, run, f"step {index} analysis")
    t.update(step_analysis=run)
    if run.phase == SUCCESSFUL:
        return True
    if run.phase in (FAILED, ERROR):
        _begin_abort(t, f"step {index} analysis {run.phase.lower()}: {run.message}")
    elif run.phase == INCONCLUSIVE_PHASE:
        t.pause = (INCONCLUSIVE, f"step {index} analysis inconclusive: {run.message}; promote skips it, abort ends it")
    return False


_STEP_HANDLERS = {ScaleUpStep: _scale, SetWeightStep: _set_weight, PauseStep: _pause, AnalysisStep: _analysis_step}


# --- traffic and engines ---

def _move_traffic(t: _Tick, percent: int) -> bool:
    """Weights {A: 100 - percent, B: percent}: True once stored and acknowledged by every gateway."""
    target = {t.a: float(100 - percent), t.b: float(percent)}
    if weights_are(t.obs.weights, target):
        _note_weight(t, percent)
        if t.obs.acknowledged:
            return True
        t.wake(WAIT_S)
        return False
    if percent > 0 and t.obs.drifted.get(t.b):
        engines = ", ".join(t.obs.drifted[t.b])
        t.pause = (DRIFT, f"{t.b} at {percent}% blocked: engines drifted from their class: {engines}")
        t.wake(DRIFT_POLL_S)
        return False
    if percent > 0 and not _ensure_b_ready(t):
        return False
    t.emit(SetWeights(target, t.allow))
    _note_weight(t, percent)
    t.wake(WAIT_S)
    return False


def _note_weight(t: _Tick, percent: int) -> None:
    if t.state.weight != percent:
        t.update(weight=percent)
        t.record("weights", f"weights: {t.b} {percent}%, {t.a} {100 - percent}%", t.state.step_index)


def _ensure_b_ready(t: _Tick) -> bool:
    """B's engines all ready (every role: the controller counts a role short as not ready); else ScaleUp."""
    desired = t.obs.desired.get(t.b, 0)
    if desired > 0 and t.obs.ready.get(t.b, 0) >= desired:
        return True
    if desired == 0:
        t.record("scale", f"scaling {t.b} up to {t.replicas} engine(s) per role", t.state.step_index)
    t.emit(ScaleUp(t.b, t.replicas))
    t.wake(WAIT_S)
    return False


# --- background analysis ---

def _run_background(t: _Tick) -> None:
    run = t.state.background
    if run is None:
        return
    run = _advance(t, run, "background analysis")
    t.update(background=run)
    if run.phase in (FAILED, ERROR):
        _begin_abort(t, f"background analysis {run.phase.lower()}: {run.message}")
    elif run.phase == INCONCLUSIVE_PHASE:
        t.pause = (INCONCLUSIVE, f"background analysis inconclusive: {run.message}; promote runs it again, "
                                 "abort ends the rollout")


def _stop_background(t: _Tick) -> None:
    """Every step is done: the background run ends (Successful, unless it already broke a limit, or one of
    its metrics never measured a pass: then Inconclusive, and the rollout pauses for promote or abort). The
    last moves (B to 100%, A drained) are not gated: a relative condition has no A to compare with by then."""
    run = t.state.background
    if run is not None and run.phase not in analysis.TERMINAL_PHASES:
        run = analysis.stop(run, "every step is done", require_evidence=True)
        t.update(background=run)
        t.record("analysis", f"background analysis stopped: every step is done ({run.phase})")
        if run.phase == INCONCLUSIVE_PHASE:
            t.pause = (INCONCLUSIVE, "background analysis inconclusive: a metric never measured a pass; "
                                     "promote finishes the rollout without it, abort ends it")


def _start_background(t: _Tick) -> None:
    wanted = t.spec.analysis
    if (wanted is None or t.state.background is not None or t.state.promote_full
            or not wanted.starting_step <= t.state.step_index < len(t.spec.steps)):
        return
    run = analysis.start(t.spec.templates, wanted.templates, "background", wanted.starting_step, t.now)
    t.record("analysis", "background analysis started: " + ", ".join(wanted.templates), t.state.step_index)
    t.update(background=_advance(t, run, "background analysis"))


def _advance(t: _Tick, run: AnalysisRun, what: str) -> AnalysisRun:
    """Advance a run; record each new measurement and the run's outcome when it ends; wake for its next
    measurement."""
    before, taken = run.phase, {(m.template, m.name): m.count for m in run.metrics}
    run = analysis.advance(run, t.spec.templates, t.obs, t.a, t.b, t.now)
    for metric in run.metrics:
        if metric.count > taken.get((metric.template, metric.name), 0) and metric.measurements:
            latest = metric.measurements[-1]
            t.record("measurement", f"{what} {metric.template}/{metric.name} #{metric.count}: {latest.phase}: "
                     f"{latest.message}", run.step_index)
    if run.phase != before and run.phase in analysis.TERMINAL_PHASES:
        t.record("analysis", f"{what} {run.phase}: {run.message}", run.step_index)
    t.wake_at(analysis.next_due(run))
    return run


# --- small helpers ---

def _shares(weights: Mapping[str, float]) -> dict[str, float]:
    total = sum(w for w in weights.values() if w > 0)
    return {ref: w / total for ref, w in weights.items() if w > 0} if total > 0 else {}


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
