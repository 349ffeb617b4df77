"""Two controllers on one PostgreSQL schema; the leader (the only one running rollouts) is killed with
SIGKILL mid-rollout, the other takes the leadership over and continues from the stored step: no step runs
twice, none is skipped, and the data plane keeps serving throughout."""

from __future__ import annotations

import time

import pytest
from rollout_api import history, make_steps, spec, start, step_starts, wait_acknowledged_on, wait_phase
from rollout_fleet import READY_TIMEOUT_S, wait_until
from rollout_load import Load, describe

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_leader_change_mid_rollout_repeats_nothing(pg_fleet):
    fleet = pg_fleet
    a, b = fleet.current(), fleet.other()
    assert fleet.leader() == 0 and fleet.serving == 1  # everything talks to the follower
    steps = make_steps("scale", 30, ("pause", "3s"), 70, ("pause", None), 100)
    with Load(fleet.gateway_url) as load:
        rollout = start(fleet, spec(b, steps), reason="test: leader change")
        wait_phase(fleet, rollout["id"], ("paused", "progressing"), timeout_s=READY_TIMEOUT_S, step_index=2)
        fleet.kill_controller(0)
        killed = time.monotonic()
        wait_until(lambda: fleet.leader() == 1, 30, "controller-1 to take the leadership")
        view = wait_phase(fleet, rollout["id"], "paused", timeout_s=60, step_index=4)
        assert view["pause_reason"] == "CanaryPauseStep", view
        assert fleet.weights() == {a: 30, b: 70}
        fleet.http("POST", f"/api/v1/rollouts/{rollout['id']}/promote", {"reason": "test: go on"})
        wait_phase(fleet, rollout["id"], "completed", timeout_s=60)
        wait_acknowledged_on(fleet, {b: 100})
    assert load.failures() == [], describe(load.snapshot())
    assert load.since(killed), "no request was sent after the leader died"
    assert step_starts(history(fleet, rollout["id"])) == list(range(len(steps)))
    fleet.wait_drained(a)
