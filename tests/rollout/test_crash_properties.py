"""The rollout machine across arbitrary crash and restart points (hypothesis).

The runtime modelled here is the reconciler's: each tick it reads the world, calls `machine.step` on the last
*stored* state, stores the transition's state together with its Record actions (one transaction: both or
neither) and applies the world actions (SetWeights, ScaleUp, Drain) in order. A crash at a tick is one of:

- `lost`: a prefix of the world actions was applied, then the controller died before storing: the state and
  its records are lost;
- `cut`: the state and records were stored, then the controller died after a prefix of the world actions.

The next tick (a restarted controller, or another leader) starts from the last stored state, in the world
as the crash left it. The world: B's engines become ready some ticks after a ScaleUp, gateways acknowledge
weights some ticks after a change, counters grow with the traffic each revision gets, B is fast or slow,
traffic is busy or too quiet for any analysis window; an operator may abort and a break-glass freeze may hold
the fleet for a while.

What must hold, over the *stored* history (what operators and the audit log see):
- no step is skipped or repeated: the stored step events are exactly step_started 0, step_done 0,
  step_started 1, step_done 1, ... in order, each once (possibly ending with a step_started whose step never
  finished: an abort or a pause). "Repeated" is precise: a Record for the same step transition (the same
  event for the same step index) stored twice counts as a repeat, even if the world actions that came with
  it were idempotent re-emissions;
- an abort always ends with all traffic on A, acknowledged by every gateway, and B drained; a completion with
  all traffic on B, acknowledged, and A drained; each is recorded once;
- an inconclusive window never advances: once a stored state holds an inconclusive step analysis, the rollout
  never leaves that step except by aborting; every analysis step that is done had a successful run;
- a weight step is done only when the reconcile saw its weights stored and acknowledged by every gateway;
- nothing is applied to the world while the fleet is frozen;
- and, once crashes stop, it gets somewhere: a busy fleet where B is fast completes; B slow under analysis aborts; a quiet fleet
  under analysis stays paused, inconclusive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, note, settings
from hypothesis import strategies as st

from fleetctl.controller.rollout.machine import abort, describe_step, step, weights_are
from fleetctl.controller.rollout.spec import AnalysisStep, RolloutSpec, SetWeightStep
from fleetctl.controller.rollout.state import (
    ABORTED, ABORTING, COMPLETED, INCONCLUSIVE, INCONCLUSIVE_PHASE, PAUSED, SUCCESSFUL, TERMINAL, Record,
    RolloutState,
)
from tests.rollout.world import A, B, Latency, World, make_spec

MAX_TICKS = 800
# Crashes stop after this many ticks. Safety holds under any crash pattern; progress needs them to stop: a
# pattern that loses every other transition after applying its actions can keep undoing the world's progress
# (a lost "step done, next weights" followed by a stored re-emission of the older weights), for ever.
CRASH_TICKS = 240
TICK_S = 5.0  # the longest a tick waits; the machine's requeue_after_s when shorter
TEMPLATES = {
    "latency": {"metrics": [{"name": "ttft", "measure": "ttft_p90_s", "successCondition": "result <= 1.5 * baseline",
                             "interval": "5s", "count": 2, "minRequests": 20}]},
    "errors": {"metrics": [{"name": "errors", "measure": "error_rate", "successCondition": "result <= 0.05",
                            "interval": "5s", "minRequests": 20}]},
}
FAST, SLOW = Latency(0.08), Latency(0.8, error_share=0.3)
BUSY, QUIET = 60.0, 0.1  # requests per second: QUIET never fills a window, however long it grows


@st.composite
def specs(draw: st.DrawFn) -> RolloutSpec:
    """A scale step or not, a first weight that gives B traffic, then weights (up to 90, so A keeps some
    traffic to compare with), timed pauses and analyses in any order; maybe background analysis from the
    first step after B has traffic, with a last pause for it to measure in."""
    steps: list[dict[str, Any]] = [{"scale": {}}] if draw(st.booleans()) else []
    weight = draw(st.integers(20, 60))
    steps.append({"setWeight": weight})
    with_traffic = len(steps)
    for kind in draw(st.lists(st.sampled_from(["setWeight", "pause", "analysis"]), max_size=6)):
        if kind == "setWeight":
            weight = draw(st.integers(weight, 90))
            steps.append({"setWeight": weight})
        elif kind == "pause":
            steps.append({"pause": {"duration": draw(st.integers(0, 30))}})
        else:
            steps.append({"analysis": {"templates": ["latency"]}})
    extra: dict[str, Any] = {"templates": TEMPLATES}
    if draw(st.booleans()):
        # it measures only while steps run (Argo stops it when every step is done): give it a pause to watch
        steps.append({"pause": {"duration": 20}})
        extra["analysis"] = {"templates": ["errors"], "startingStep": with_traffic}
    return make_spec(steps, **extra)


crash = st.one_of(st.none(), st.tuples(st.sampled_from(["lost", "cut"]), st.integers(0, 4)))


@dataclass
class Scenario:
    spec: RolloutSpec
    world: World
    crashes: list[tuple[str, int] | None]  # repeated: tick i < CRASH_TICKS crashes as crashes[i % len] says
    abort_at: int | None  # the tick an operator aborts at
    freeze: tuple[int, int] | None  # ticks [start, end) frozen


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    world = World(ready_after=draw(st.integers(0, 5)), ack_after=draw(st.integers(0, 5)),
                  rate=draw(st.sampled_from([BUSY, QUIET])), gateways=("gw-1", "gw-2", "gw-3")[:draw(st.integers(1, 3))],
                  serving={A: FAST, B: draw(st.sampled_from([FAST, SLOW]))})
    freeze = None
    if draw(st.booleans()):
        start = draw(st.integers(0, 40))
        freeze = (start, start + draw(st.integers(1, 15)))
    # repeated for CRASH_TICKS ticks, so crashes land at every kind of point, abort and completion included;
    # one tick in each repetition stores in full
    crashes = draw(st.lists(crash, max_size=8)) + [None]
    return Scenario(draw(specs()), world, crashes,
                    draw(st.one_of(st.none(), st.integers(0, 80))), freeze)


@dataclass
class Run:
    """What the runtime stored, in order, and the states it stored."""

    records: list[Record] = field(default_factory=list)
    states: list[RolloutState] = field(default_factory=list)
    frozen_writes: int = 0
    weight_steps_done: list[tuple[int | None, bool]] = field(default_factory=list)  # (step, seen stored and acked)


def simulate(s: Scenario) -> tuple[RolloutState, Run]:
    stored, run, world = RolloutState(), Run(), s.world
    for index in range(MAX_TICKS):
        if stored.phase in TERMINAL:
            break
        world.frozen = s.freeze is not None and s.freeze[0] <= index < s.freeze[1]
        if index == s.abort_at and stored.phase != ABORTING:
            stored = abort(stored, "operator abort", world.now)  # the API, under the version check
            run.states.append(stored)
        transition = step(s.spec, stored, world.observe(), world.now, A, B, replicas=2)
        records = [a for a in transition.actions if isinstance(a, Record)]
        effects = [a for a in transition.actions if not isinstance(a, Record)]
        plan = s.crashes[index % len(s.crashes)] if index < CRASH_TICKS else None
        kind, prefix = plan or ("none", len(effects))
        if kind != "lost":
            stored = transition.state
            run.states.append(stored)
            run.records.extend(records)
            observed = world.observe()
            run.weight_steps_done.extend(
                (r.step, weights_are(observed.weights, _split(s.spec, r.step)) and observed.acknowledged)
                for r in records if r.event == "step_done" and r.step in weight_steps(s.spec))
        for action in effects[:prefix]:
            world.apply(action)
            run.frozen_writes += world.frozen
        world.advance(min(transition.requeue_after_s or TICK_S, TICK_S) or 0.5)
    return stored, run


def describe(s: Scenario) -> str:
    steps = [describe_step(x) for x in s.spec.steps]
    background = s.spec.analysis.model_dump(by_alias=True) if s.spec.analysis else None
    w = s.world
    return (f"steps {steps}, background {background}; rate {w.rate}/s, B {w.serving[B]}, ready after "
            f"{w.ready_after}, ack after {w.ack_after}, {len(w.gateways)} gateway(s); crashes {s.crashes}, "
            f"abort at {s.abort_at}, freeze {s.freeze}")


def step_events(records: list[Record]) -> list[tuple[str, int | None]]:
    return [(r.event, r.step) for r in records if r.event in ("step_started", "step_done")]


def analysis_steps(spec: RolloutSpec) -> set[int]:
    return {i for i, step_ in enumerate(spec.steps) if isinstance(step_, AnalysisStep)}


def weight_steps(spec: RolloutSpec) -> set[int]:
    return {i for i, step_ in enumerate(spec.steps) if isinstance(step_, SetWeightStep)}


def _split(spec: RolloutSpec, index: int | None) -> dict[str, float]:
    current = spec.steps[index or 0]
    assert isinstance(current, SetWeightStep)
    return {A: 100 - current.set_weight, B: current.set_weight}


def gated(spec: RolloutSpec) -> bool:
    return bool(analysis_steps(spec)) or spec.analysis is not None


@settings(max_examples=250, deadline=None)
@given(scenarios())
def test_no_step_is_skipped_or_repeated_and_abort_returns_everything_to_a(s: Scenario) -> None:
    note(describe(s))
    final, run = simulate(s)
    world = s.world
    note(f"ended {final.phase} at step {final.step_index}: {final.message}")

    events = step_events(run.records)
    expected = [(kind, i) for i in range(len(s.spec.steps)) for kind in ("step_started", "step_done")]
    assert events == expected[:len(events)], events
    assert final.phase != COMPLETED or events == expected

    assert run.frozen_writes == 0
    assert all(seen for _, seen in run.weight_steps_done), run.weight_steps_done
    if final.phase == ABORTED:
        assert weights_are(world.weights, {A: 100}) and world.ack_in == 0 and world.desired.get(B, 0) == 0
        assert final.abort_reason and [r.event for r in run.records].count("aborted") == 1
    if final.phase == COMPLETED:
        assert weights_are(world.weights, {B: 100}) and world.ack_in == 0 and world.desired.get(A, 0) == 0
        assert [r.event for r in run.records].count("completed") == 1

    _inconclusive_never_advances(s.spec, run)
    _gets_somewhere(s, final)


def _inconclusive_never_advances(spec: RolloutSpec, run: Run) -> None:
    stuck_at = None
    for state in run.states:
        if stuck_at is not None:
            assert state.step_index == stuck_at or state.phase in (ABORTING, ABORTED), (stuck_at, state)
        analysis_run = state.step_analysis
        if analysis_run is not None and analysis_run.phase == INCONCLUSIVE_PHASE and stuck_at is None:
            stuck_at = state.step_index
    successful = {r.step for r in run.records if r.event == "analysis" and SUCCESSFUL in r.message}
    for event, index in step_events(run.records):
        if event == "step_done" and index in analysis_steps(spec):
            assert index in successful


def _gets_somewhere(s: Scenario, final: RolloutState) -> None:
    aborted_by_operator = s.abort_at is not None and final.abort_reason == "operator abort"
    if aborted_by_operator:
        assert final.phase == ABORTED
        return
    quiet, slow = s.world.rate == QUIET, s.world.serving[B] is SLOW
    if not gated(s.spec):
        assert final.phase == COMPLETED
    elif quiet:
        assert final.phase == PAUSED and final.pause_reason == INCONCLUSIVE
    elif slow:
        assert final.phase == ABORTED and "analysis failed" in (final.abort_reason or "")
    else:
        assert final.phase == COMPLETED
