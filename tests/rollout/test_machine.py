"""fleetctl.controller.rollout.machine.step: each step type against a small simulated fleet (tests/rollout/
world.py), with time moved by hand."""

from __future__ import annotations

from datetime import timedelta

from fleetctl.controller.rollout.machine import step
from fleetctl.controller.rollout.state import (
    ABORTED, ABORTING, COMPLETED, DRIFT, FREEZE, INCONCLUSIVE, PAUSE_STEP, PAUSED, PROGRESSING, SUCCESSFUL, Drain,
    Record, RolloutState, ScaleUp, SetWeights,
)
from tests.rollout.world import A, B, T0, Latency, World, drive, make_spec, records, tick

LATENCY = {"metrics": [{"name": "ttft", "measure": "ttft_p90_s", "successCondition": "result <= 1.2 * baseline",
                        "interval": "10s", "count": 2, "minRequests": 20}]}


def weights_of(actions: list) -> list[dict[str, float]]:
    return [dict(a.weights) for a in actions if isinstance(a, SetWeights)]


def test_scale_waits_for_every_engine_of_b_before_the_next_step() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 10}], replicas=3)
    world = World(ready_after=4)
    state, actions = drive(spec, world, ticks=4)
    assert state.step_index == 0 and world.desired[B] == 3 and world.ready[B] == 0
    assert ScaleUp(B, 3) in actions and not weights_of(actions)
    state, more = drive(spec, world, state, until=lambda s: s.step_index == 2)
    assert weights_of(more)[0] == {A: 90.0, B: 10.0}
    assert [r.step for r in records(actions + more, "step_done")][:1] == [0]


def test_without_a_scale_step_b_is_scaled_before_the_first_weight_above_zero() -> None:
    spec = make_spec([{"setWeight": 0}, {"setWeight": 20}])
    world = World(ready_after=3)
    state, actions = drive(spec, world, ticks=3)
    assert state.step_index == 1  # setWeight 0 needs no engine of B
    assert ScaleUp(B, 2) in actions and not weights_of(actions)
    state, actions = drive(spec, world, state, until=lambda s: s.step_index == 2)
    assert weights_of(actions)[0] == {A: 80.0, B: 20.0} and world.ready[B] == 2


def test_set_weight_is_done_only_when_stored_and_acknowledged() -> None:
    spec = make_spec([{"setWeight": 30}, {"pause": {}}], allowCorrectnessChange={"reason": "bf16 KV"})
    world = World(ack_after=5)
    world.desired[B] = world.ready[B] = 2
    first = step(spec, RolloutState(), world.observe(), world.now, A, B)
    assert SetWeights({A: 70.0, B: 30.0}, allow_correctness_change=True) in first.actions
    assert first.state.weight == 30 and first.state.step_index == 0 and first.requeue_after_s == 1.0
    for action in first.actions:
        world.apply(action)
    state, _ = drive(spec, world, first.state, ticks=4)
    assert state.step_index == 0  # stored, not yet acknowledged by every gateway
    state, _ = drive(spec, world, state, until=lambda s: s.step_index == 1)
    assert world.ack_in == 0 and world.weights == {A: 70.0, B: 30.0}


def test_drift_on_b_blocks_a_step_that_sends_it_traffic_until_it_is_gone() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 10}])
    world = World(drifted={B: ("chat-r2-decode-0",)})
    state, actions = drive(spec, world, ticks=10)
    assert state.phase == PAUSED and state.pause_reason == DRIFT and state.step_index == 1
    assert not weights_of(actions) and len(records(actions, "paused")) == 1
    assert "chat-r2-decode-0" in records(actions, "paused")[0].message
    world.drifted = {}
    state, actions = drive(spec, world, state)
    assert state.phase == COMPLETED and weights_of(actions)[0] == {A: 90.0, B: 10.0}


def test_a_timed_pause_ends_at_its_duration_and_asks_to_be_woken_then() -> None:
    spec = make_spec([{"pause": {"duration": "2m"}}, {"setWeight": 0}])
    world = World()
    first = step(spec, RolloutState(), world.observe(), T0, A, B)
    assert first.state.phase == PAUSED and first.state.pause_reason == PAUSE_STEP and first.requeue_after_s == 120
    later = step(spec, first.state, world.observe(), T0 + timedelta(seconds=119), A, B)
    assert later.state.step_index == 0 and later.requeue_after_s == 1.0 and not later.actions
    done = step(spec, later.state, world.observe(), T0 + timedelta(seconds=120), A, B)
    assert done.state.step_index >= 1 and done.state.phase == PROGRESSING


def test_an_indefinite_pause_waits_for_promote() -> None:
    from fleetctl.controller.rollout.machine import promote
    spec = make_spec([{"pause": {}}, {"setWeight": 0}])
    world = World()
    state, actions = drive(spec, world, ticks=50)
    assert state.phase == PAUSED and state.pause_reason == PAUSE_STEP and state.step_index == 0
    assert len(records(actions, "paused")) == 1
    state = promote(state, world.now)
    state, actions = drive(spec, world, state)
    assert state.phase == COMPLETED and [r.step for r in records(actions, "step_started")] == [1]


def test_inline_analysis_passes_to_the_next_step() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 50}, {"analysis": {"templates": ["latency"]}}],
                     templates={"latency": LATENCY})
    world = World(rate=20.0)
    state, actions = drive(spec, world)
    assert state.phase == COMPLETED
    outcome = [r for r in records(actions, "analysis") if r.step == 2]
    assert len(outcome) == 1 and SUCCESSFUL in outcome[0].message
    measured = records(actions, "measurement")  # each measurement is in the history, once (count: 2)
    assert [m.message.split(":")[0] for m in measured] == [
        "step 2 analysis latency/ttft #1", "step 2 analysis latency/ttft #2"]
    assert all(m.step == 2 and "Successful" in m.message for m in measured)


def test_inline_analysis_failure_aborts_back_to_a_and_drains_b() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 50}, {"analysis": {"templates": ["latency"]}}, {"setWeight": 80}],
                     templates={"latency": LATENCY})
    world = World(rate=20.0, ack_after=2, serving={A: Latency(0.08), B: Latency(0.8)})
    state, actions = drive(spec, world)
    assert state.phase == ABORTED and "step 2 analysis failed" in (state.abort_reason or "")
    assert world.weights == {A: 100.0} and world.ack_in == 0 and world.desired[B] == 0
    assert {A: 20.0, B: 80.0} not in weights_of(actions)
    # B is drained only after every gateway acknowledged the weights back on A
    drain = next(i for i, a in enumerate(world.applied) if a == Drain(B))
    back = max(i for i, a in enumerate(world.applied) if isinstance(a, SetWeights))
    assert drain > back


def test_too_few_requests_make_the_analysis_inconclusive_and_it_never_advances() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 10}, {"analysis": {"templates": ["latency"]}}, {"setWeight": 90}],
                     templates={"latency": LATENCY})
    world = World(rate=2.0)  # B sees ~2 requests per 10 s window: below minRequests
    state, actions = drive(spec, world, ticks=300)
    assert state.phase == PAUSED and state.pause_reason == INCONCLUSIVE and state.step_index == 2
    assert {A: 10.0, B: 90.0} not in weights_of(actions)
    assert "minRequests" in (state.step_analysis.message if state.step_analysis else "")


def test_promote_skips_an_inconclusive_analysis_step() -> None:
    from fleetctl.controller.rollout.machine import promote
    spec = make_spec([{"scale": {}}, {"analysis": {"templates": ["latency"]}}, {"setWeight": 100}],
                     templates={"latency": LATENCY})
    world = World(rate=0.0)
    state, _ = drive(spec, world, ticks=100)
    assert state.pause_reason == INCONCLUSIVE
    state, actions = drive(spec, world, promote(state, world.now))
    assert state.phase == COMPLETED and [r.step for r in records(actions, "step_started")] == [2]


def test_background_analysis_failure_aborts_at_any_step() -> None:
    errors = {"metrics": [{"name": "errors", "measure": "error_rate", "successCondition": "result < 0.05",
                           "interval": "5s", "minRequests": 5}]}
    spec = make_spec([{"scale": {}}, {"setWeight": 20}, {"pause": {"duration": "10m"}}, {"setWeight": 100}],
                     analysis={"templates": ["errors"], "startingStep": 1}, templates={"errors": errors})
    world = World(rate=40.0, serving={A: Latency(), B: Latency(error_share=0.5)})
    state, actions = drive(spec, world)
    assert state.phase == ABORTED and (state.abort_reason or "").startswith("background analysis failed")
    assert state.step_index == 2 and world.weights == {A: 100.0}
    started = records(actions, "analysis")[0]
    assert started.message.startswith("background analysis started") and started.step == 1


def test_background_analysis_is_stopped_successful_when_every_step_is_done() -> None:
    errors = {"metrics": [{"name": "errors", "measure": "error_rate", "successCondition": "result < 0.05",
                           "interval": "5s", "minRequests": 5}]}
    spec = make_spec([{"scale": {}}, {"setWeight": 20}, {"pause": {"duration": "30s"}}],
                     analysis={"templates": ["errors"]}, templates={"errors": errors})
    state, _ = drive(spec, World(rate=40.0))
    assert state.phase == COMPLETED and state.background is not None
    assert state.background.phase == SUCCESSFUL and state.background.metrics[0].successful >= 3


def test_a_background_analysis_that_never_measured_a_pass_pauses_the_end_until_promote() -> None:
    """A gate never passes for lack of data: the steps were done before the background metric's first
    measurement was due, so it never measured a pass."""
    from fleetctl.controller.rollout.commands import promote

    errors = {"metrics": [{"name": "errors", "measure": "error_rate", "successCondition": "result < 0.05",
                           "interval": "10m", "minRequests": 5}]}
    spec = make_spec([{"scale": {}}, {"setWeight": 20}, {"pause": {"duration": "3s"}}],
                     analysis={"templates": ["errors"]}, templates={"errors": errors})
    world = World(rate=40.0)
    state, _ = drive(spec, world, ticks=40)
    assert state.phase == PAUSED and state.pause_reason == INCONCLUSIVE and state.step_index == 3
    assert world.weights == {A: 80.0, B: 20.0}  # the end's move of all traffic to B waits
    state, _ = drive(spec, world, promote(state, world.now))
    assert state.phase == COMPLETED and world.weights == {B: 100.0}


def test_the_end_moves_all_traffic_to_b_then_drains_a() -> None:
    spec = make_spec([{"setWeight": 40}])
    world = World(ack_after=2)
    state, actions = drive(spec, world)
    assert state.phase == COMPLETED and state.weight == 100
    assert weights_of(actions)[-1] == {A: 0.0, B: 100.0} and world.desired[A] == 0
    drain = next(i for i, a in enumerate(world.applied) if a == Drain(A))
    assert all(not isinstance(a, SetWeights) for a in world.applied[drain:])
    assert records(actions)[-1].event == "completed"


def test_an_operator_abort_returns_traffic_to_a_acknowledged_then_drains_b() -> None:
    from fleetctl.controller.rollout.machine import abort
    spec = make_spec([{"scale": {}}, {"setWeight": 50}, {"pause": {}}])
    world = World(ack_after=3)
    state, _ = drive(spec, world, until=lambda s: s.phase == PAUSED)
    state = abort(state, "latency looks off", world.now)
    assert state.phase == ABORTING and state.weight == 0
    transition = tick(spec, world, state)
    assert transition.actions == (SetWeights({A: 100.0, B: 0.0}, False),)
    state, actions = drive(spec, world, transition.state)
    assert state.phase == ABORTED and state.abort_reason == "latency looks off"
    assert world.weights == {A: 100.0} and world.ack_in == 0 and world.desired[B] == 0
    assert records(actions)[-1].event == "aborted"


def test_a_freeze_pauses_the_rollout_and_lifting_it_resumes() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 10}, {"setWeight": 60}])
    world = World(ack_after=1)
    state, _ = drive(spec, world, until=lambda s: s.step_index == 2)
    world.frozen = True
    before = len(world.applied)
    state, actions = drive(spec, world, state, ticks=20)
    assert state.phase == PAUSED and state.paused_by == FREEZE and state.step_index == 2
    assert all(isinstance(a, Record) for a in world.applied[before:]) and [r.event for r in records(actions)] == ["paused"]
    world.frozen = False
    state, actions = drive(spec, world, state)
    assert state.phase == COMPLETED and records(actions)[0].event == "resumed"


def test_an_operator_pause_during_a_freeze_outlasts_it() -> None:
    from fleetctl.controller.rollout.machine import pause, resume
    spec = make_spec([{"scale": {}}, {"setWeight": 10}])
    world = World(frozen=True)
    state, _ = drive(spec, world, ticks=3)
    assert state.paused_by == FREEZE
    state = pause(state, "alice", world.now)
    world.frozen = False
    state, actions = drive(spec, world, state, ticks=10)
    assert state.phase == PAUSED and state.paused_by == "alice" and not actions
    state, _ = drive(spec, world, resume(state, world.now))
    assert state.phase == COMPLETED


def test_an_abort_during_a_freeze_waits_for_the_freeze_to_lift() -> None:
    from fleetctl.controller.rollout.machine import abort
    spec = make_spec([{"scale": {}}, {"setWeight": 50}, {"pause": {}}])
    world = World()
    state, _ = drive(spec, world, until=lambda s: s.phase == PAUSED)
    world.frozen = True
    state, _ = drive(spec, world, abort(state, "stop", world.now), ticks=5)
    assert state.phase == ABORTING and world.weights == {A: 50.0, B: 50.0}
    world.frozen = False
    state, _ = drive(spec, world, state)
    assert state.phase == ABORTED and world.weights == {A: 100.0}


def test_terminal_rollouts_do_nothing() -> None:
    spec = make_spec([{"setWeight": 10}])
    world = World()
    for phase in (COMPLETED, ABORTED):
        transition = step(spec, RolloutState(phase=phase), world.observe(), T0, A, B)
        assert transition.actions == () and transition.requeue_after_s is None


def test_analysis_errors_are_retried_then_abort() -> None:
    quality = {"metrics": [{"name": "golden", "measure": "quality", "successCondition": "result >= 1",
                            "interval": "10s", "consecutiveErrorLimit": 2}]}
    spec = make_spec([{"scale": {}}, {"setWeight": 10}, {"analysis": {"templates": ["quality"]}}],
                     templates={"quality": quality})
    world = World(quality={A: "pass", B: None})
    state, actions = drive(spec, world)
    assert state.phase == ABORTED and "step 2 analysis error" in (state.abort_reason or "")
    assert "quality: not measured" in (state.abort_reason or "")
    run = state.step_analysis
    assert run is not None and run.metrics[0].error == 3 and run.metrics[0].count == 0
    assert world.weights == {A: 100.0}


def test_an_analysis_whose_metrics_never_run_in_a_step_is_recorded_and_passed() -> None:
    never = {"metrics": [{"name": "ttft", "measure": "ttft_p90_s", "successCondition": "result <= 1", "count": 0}]}
    spec = make_spec([{"analysis": {"templates": ["never"]}}, {"setWeight": 0}], templates={"never": never})
    state, actions = drive(spec, World())
    assert state.phase == COMPLETED
    outcome = records(actions, "analysis")
    assert len(outcome) == 1 and outcome[0].step == 0 and "count 0" in outcome[0].message


def test_without_a_quality_metric_a_canary_alarm_on_b_aborts_the_rollout() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 20}, {"pause": {}}])
    world = World()
    state, _ = drive(spec, world, until=lambda s: s.phase == PAUSED)
    world.quality = {B: "pass"}
    state, _ = drive(spec, world, state, ticks=3)
    assert state.phase == PAUSED  # a healthy verdict changes nothing
    world.quality = {B: "fail"}
    state, actions = drive(spec, world, state, until=lambda s: s.phase == ABORTED)
    assert "quality canary" in (state.abort_reason or "")
    assert weights_of(actions)[0] == {A: 100.0, B: 0.0} and Drain(B) in actions


def test_a_spec_that_measures_quality_leaves_the_canary_to_its_metric_limits() -> None:
    quality = {"metrics": [{"name": "q", "measure": "quality", "successCondition": "result >= 1",
                            "interval": "10s", "failureLimit": 3}]}
    spec = make_spec([{"scale": {}}, {"setWeight": 20}, {"pause": {"duration": "15s"}}, {"setWeight": 40}],
                     analysis={"templates": ["q"]}, templates={"q": quality})
    world = World(quality={A: "pass", B: "fail"})
    state, _ = drive(spec, world, ticks=8)
    assert state.phase != ABORTING and state.phase != ABORTED  # one failed measurement is within failureLimit 3
