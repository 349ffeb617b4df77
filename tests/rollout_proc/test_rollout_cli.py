"""`fleetctl rollout pause|resume|promote|abort|retry|undo` as an operator runs them (subprocesses finding the
controller and token in FLEET_CONTROLLER / FLEET_TOKEN), against the live fleet: each verb changes the
rollout as documented (docs/rollouts.md) and is audited with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rollout_api import get, make_steps, spec, wait_acknowledged_on, wait_phase
from rollout_fleet import READY_TIMEOUT_S, RolloutFleet

pytestmark = pytest.mark.slow


def ok(fleet: RolloutFleet, *args: str) -> str:
    result = fleet.cli(*args)
    assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
    return result.stdout


def verb(fleet: RolloutFleet, name: str, rollout_id: int, *flags: str) -> None:
    ok(fleet, "rollout", name, str(rollout_id), *flags, "--reason", f"test: {name}")


def test_cli_pause_resume_promote_abort_retry_undo(fleet, tmp_path: Path):
    a, b = fleet.current(), fleet.other()
    steps = make_steps("scale", 20, ("pause", None), 60, ("pause", None), 100)
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(spec(b, steps, replicas=1)))
    rollout_id = json.loads(ok(fleet, "rollout", "start", "-f", str(path), "--reason", "test: cli", "-o", "json"))["id"]

    view = wait_phase(fleet, rollout_id, "paused", timeout_s=READY_TIMEOUT_S, step_index=2)
    assert view["pause_reason"] == "CanaryPauseStep" and fleet.weights() == {a: 80, b: 20}

    verb(fleet, "pause", rollout_id)  # an operator's pause on top of the step's
    view = get(fleet, rollout_id)
    assert view["phase"] == "paused" and view["pause_reason"] == "PausedByOperator" and view["paused_by"], view
    verb(fleet, "resume", rollout_id)  # back to the step's own pause, which waits for promote
    view = wait_phase(fleet, rollout_id, "paused", timeout_s=30, step_index=2)
    assert view["pause_reason"] == "CanaryPauseStep" and view["paused_by"] is None, view

    verb(fleet, "promote", rollout_id)  # past the indefinite pause: setWeight 60, then the next pause
    wait_phase(fleet, rollout_id, "paused", timeout_s=60, step_index=4)
    wait_acknowledged_on(fleet, {a: 40, b: 60})

    verb(fleet, "abort", rollout_id)
    view = wait_phase(fleet, rollout_id, "aborted", timeout_s=60)
    assert view["abort_reason"] and "test: abort" in view["abort_reason"], view
    wait_acknowledged_on(fleet, {a: 100})

    verb(fleet, "retry", rollout_id)  # the steps again, from the start
    wait_phase(fleet, rollout_id, "paused", timeout_s=READY_TIMEOUT_S, step_index=2)
    wait_acknowledged_on(fleet, {a: 80, b: 20})
    verb(fleet, "promote", rollout_id, "--full")  # every remaining step skipped: straight to 100% on B
    wait_phase(fleet, rollout_id, "completed", timeout_s=60)
    wait_acknowledged_on(fleet, {b: 100})

    status = json.loads(ok(fleet, "rollout", "status", str(rollout_id), "-o", "json"))
    assert status["phase"] == "completed" and status["to_ref"] == b

    undone = json.loads(ok(fleet, "rollout", "undo", str(rollout_id), "--reason", "test: undo", "-o", "json"))
    undo_id = undone["id"]
    assert (undone["from_ref"], undone["to_ref"]) == (b, a), undone
    wait_phase(fleet, undo_id, ("paused", "completed"), timeout_s=READY_TIMEOUT_S)
    if get(fleet, undo_id)["phase"] == "paused":  # the undo runs the same steps back: promote it through
        verb(fleet, "promote", undo_id, "--full")
    wait_phase(fleet, undo_id, "completed", timeout_s=120)
    wait_acknowledged_on(fleet, {a: 100})
    fleet.wait_drained(b)

    with fleet.client() as api:
        audited = {e.reason for e in api.list_audit(limit=500)
                   if e.action == "rollout.command" and e.target == f"rollouts/{rollout_id}" and e.result == "ok"}
    assert {f"test: {name}" for name in ("pause", "resume", "promote", "abort", "retry", "undo")} <= audited, audited
