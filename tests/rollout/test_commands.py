"""The operator's commands over a rollout's state (fleetctl.controller.rollout.commands): what each does,
and the one-line refusal when the state does not allow it."""

from __future__ import annotations

import pytest

from fleetctl.controller.rollout.machine import CommandRefused, abort, pause, promote, resume, retry
from fleetctl.controller.rollout.state import (
    ABORTED, ABORTING, BY_OPERATOR, COMPLETED, DRIFT, FREEZE, INCONCLUSIVE, PAUSE_STEP, PAUSED, PROGRESSING,
    RolloutState,
)
from fleetctl.errors import Conflict
from tests.rollout.world import A, B, T0, World, drive, make_spec, records

LATENCY = {"metrics": [{"name": "ttft", "measure": "ttft_p90_s", "successCondition": "result <= 0.5",
                        "interval": "10s", "count": 2, "minRequests": 20}]}


def refused(command, *args, **kwargs) -> CommandRefused:
    with pytest.raises(CommandRefused) as caught:
        command(*args, **kwargs)
    assert isinstance(caught.value, Conflict) and caught.value.status == 409
    assert "\n" not in caught.value.message and caught.value.code
    return caught.value


@pytest.mark.parametrize("phase", [COMPLETED, ABORTED])
def test_finished_rollouts_refuse_pause_resume_and_promote(phase: str) -> None:
    state = RolloutState(phase=phase)
    for command, args in ((pause, ("alice", T0)), (resume, (T0,)), (promote, (T0,))):
        assert refused(command, state, *args).code == f"rollout_{phase}"


def test_promote_of_a_completed_rollout_says_so() -> None:
    assert "completed" in refused(promote, RolloutState(phase=COMPLETED), T0, full=True).message


def test_pause_then_resume_lifts_only_the_operators_hold() -> None:
    state = pause(RolloutState(step_index=2), "alice", T0)
    assert (state.phase, state.paused_by, state.pause_reason) == (PAUSED, "alice", BY_OPERATOR)
    assert "alice" in refused(pause, state, "bob", T0).message
    resumed = resume(state, T0)
    assert (resumed.phase, resumed.paused_by, resumed.pause_reason) == (PROGRESSING, None, None)
    assert refused(resume, resumed, T0).code == "not_paused_by_operator"


def test_resume_does_not_move_past_a_pause_step_or_a_freeze() -> None:
    at_pause = RolloutState(phase=PAUSED, pause_reason=PAUSE_STEP)
    assert "promote" in refused(resume, at_pause, T0).message
    frozen = RolloutState(phase=PAUSED, paused_by=FREEZE)
    assert refused(resume, frozen, T0).code == "frozen"
    assert refused(promote, frozen, T0).code == "frozen"


def test_an_operator_pause_at_a_pause_step_keeps_the_steps_reason() -> None:
    state = pause(RolloutState(phase=PAUSED, step_index=1, step_started_at=T0, pause_reason=PAUSE_STEP), "alice", T0)
    assert state.pause_reason == PAUSE_STEP and state.paused_by == "alice"
    resumed = resume(state, T0)
    assert resumed.pause_reason == PAUSE_STEP and resumed.paused_by is None and resumed.step_index == 1


def test_promote_moves_past_a_pause_step_even_a_timed_one() -> None:
    state = RolloutState(phase=PAUSED, step_index=3, step_started_at=T0, pause_reason=PAUSE_STEP)
    promoted = promote(state, T0)
    assert (promoted.step_index, promoted.step_started_at, promoted.phase) == (4, None, PROGRESSING)


def test_promote_of_an_operator_pause_at_a_weight_step_only_unpauses() -> None:
    state = pause(RolloutState(step_index=1, step_started_at=T0), "alice", T0)
    promoted = promote(state, T0)
    assert promoted.step_index == 1 and promoted.paused_by is None and promoted.phase == PROGRESSING


def test_promote_refuses_when_nothing_waits() -> None:
    assert refused(promote, RolloutState(step_index=1, step_started_at=T0), T0).code == "nothing_to_promote"
    drift = refused(promote, RolloutState(phase=PAUSED, step_index=1, pause_reason=DRIFT), T0)
    assert "drift" in drift.message


def test_promote_skips_a_running_step_analysis() -> None:
    spec = make_spec([{"scale": {}}, {"analysis": {"templates": ["latency"]}}, {"setWeight": 100}],
                     templates={"latency": LATENCY})
    world = World(rate=20.0)
    state, _ = drive(spec, world, until=lambda s: s.step_analysis is not None)
    promoted = promote(state, world.now)
    assert promoted.step_index == 2 and promoted.step_analysis is None
    state, actions = drive(spec, world, promoted)
    assert state.phase == COMPLETED and not records(actions, "analysis")


def test_promote_restarts_an_inconclusive_background_analysis() -> None:
    errors = {"metrics": [{"name": "errors", "measure": "error_rate", "successCondition": "result < 0.05",
                           "interval": "5s", "minRequests": 50}]}
    spec = make_spec([{"scale": {}}, {"setWeight": 10}, {"pause": {"duration": "1h"}}],
                     analysis={"templates": ["errors"]}, templates={"errors": errors})
    world = World(rate=1.0)
    state, _ = drive(spec, world, until=lambda s: s.pause_reason == INCONCLUSIVE)
    assert state.background is not None and state.background.phase == "Inconclusive"
    promoted = promote(state, world.now)
    assert promoted.background is None and promoted.pause_reason is None and promoted.step_index == state.step_index
    world.rate = 100.0
    state, _ = drive(spec, world, promoted, ticks=5)
    assert state.background is not None and state.background.phase == "Running"


def test_promote_full_skips_every_remaining_step_and_analysis() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 10}, {"pause": {}}, {"analysis": {"templates": ["latency"]}},
                      {"setWeight": 50}], templates={"latency": LATENCY})
    world = World()
    state, _ = drive(spec, world, until=lambda s: s.phase == PAUSED)
    state, actions = drive(spec, world, promote(state, world.now, full=True))
    assert state.phase == COMPLETED and state.promote_full
    assert [dict(a.weights) for a in actions if hasattr(a, "weights")] == [{A: 0.0, B: 100.0}]
    assert [r.event for r in records(actions)][:1] == ["skipped"] and not records(actions, "step_started")


def test_promote_full_still_scales_b_first() -> None:
    spec = make_spec([{"pause": {}}, {"setWeight": 50}])
    world = World(ready_after=3)
    state, _ = drive(spec, world, until=lambda s: s.phase == PAUSED)
    state, actions = drive(spec, world, promote(state, world.now, full=True))
    assert state.phase == COMPLETED
    kinds = [type(a).__name__ for a in world.applied if type(a).__name__ != "Record"]
    assert kinds.index("ScaleUp") < kinds.index("SetWeights")


def test_abort_is_refused_once_finished_or_already_aborting() -> None:
    assert "undo" in refused(abort, RolloutState(phase=COMPLETED), "x", T0).message
    assert refused(abort, RolloutState(phase=ABORTED), "x", T0).code == "rollout_aborted"
    assert refused(abort, RolloutState(phase=ABORTING), "x", T0).code == "rollout_aborting"


def test_abort_clears_an_operators_pause_but_not_a_freeze() -> None:
    paused = abort(pause(RolloutState(step_index=1), "alice", T0), "bad", T0)
    assert (paused.phase, paused.paused_by, paused.abort_reason) == (ABORTING, None, "bad")
    frozen = abort(RolloutState(phase=PAUSED, paused_by=FREEZE), "bad", T0)
    assert frozen.phase == ABORTING and frozen.paused_by == FREEZE


def test_retry_runs_the_steps_again_from_zero() -> None:
    spec = make_spec([{"scale": {}}, {"setWeight": 50}, {"pause": {}}])
    world = World()
    state, _ = drive(spec, world, until=lambda s: s.phase == PAUSED)
    state, _ = drive(spec, world, abort(state, "try later", world.now))
    assert state.phase == ABORTED
    again = retry(state, world.now)
    assert (again.phase, again.step_index, again.abort_reason, again.weight) == (PROGRESSING, 0, None, 0)
    state, actions = drive(spec, world, again, until=lambda s: s.phase == PAUSED)
    assert [r.step for r in records(actions, "step_started")] == [0, 1, 2] and world.weights == {A: 50.0, B: 50.0}


def test_retry_is_refused_unless_aborted() -> None:
    for phase in (PROGRESSING, PAUSED, ABORTING, COMPLETED):
        assert refused(retry, RolloutState(phase=phase), T0).code == "not_aborted"
