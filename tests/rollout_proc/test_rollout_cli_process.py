"""`fleetctl rollout pause|resume|promote|abort|retry|undo` as an operator runs them (subprocesses finding the
controller and token in FLEET_CONTROLLER / FLEET_TOKEN), against the live fleet: each verb changes the
rollout as documented (docs/rollouts.md) and is audited with its reason."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from rollout_api import get, make_steps, spec, wait_acknowledged_on, wait_phase
from rollout_fleet import READY_TIMEOUT_S, RolloutFleet

from fleetctl.controller.auth import ENV_TOKEN_NAME  # who the fleet's token is

pytestmark = pytest.mark.slow

TIMED_PAUSE_S = 8  # long enough for the `pause` command to land within it


def ok(fleet: RolloutFleet, *args: str) -> str:
    result = fleet.cli(*args)
    assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
    return result.stdout


def verb(fleet: RolloutFleet, name: str, rollout_id: int, *flags: str) -> None:
    ok(fleet, "rollout", name, str(rollout_id), *flags, "--reason", f"test: {name}")


def test_cli_pause_resume_promote_abort_retry_undo(fleet, tmp_path: Path):
    a, b = fleet.current(), fleet.other()
    steps = make_steps("scale", 20, ("pause", f"{TIMED_PAUSE_S}s"), 60, ("pause", None), 100)
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(spec(b, steps, replicas=1)))
    rollout_id = json.loads(ok(fleet, "rollout", "start", "-f", str(path), "--reason", "test: cli", "-o", "json"))["id"]

    # pause: an operator's hold on top of the timed pause; the pause's end does not move the rollout
    wait_phase(fleet, rollout_id, "paused", timeout_s=READY_TIMEOUT_S, step_index=2)
    paused_at = time.monotonic()
    verb(fleet, "pause", rollout_id)
    view = get(fleet, rollout_id)
    assert (view["phase"], view["step_index"], view["paused_by"]) == ("paused", 2, ENV_TOKEN_NAME), view
    time.sleep(max(0.0, paused_at + TIMED_PAUSE_S + 1 - time.monotonic()))
    view = get(fleet, rollout_id)
    assert (view["phase"], view["step_index"]) == ("paused", 2) and view["paused_by"], view

    # resume: the hold lifted, the rollout goes on to the indefinite pause
    verb(fleet, "resume", rollout_id)
    view = wait_phase(fleet, rollout_id, "paused", timeout_s=60, step_index=4)
    assert view["pause_reason"] == "CanaryPauseStep" and view["paused_by"] is None, view
    wait_acknowledged_on(fleet, {a: 40, b: 60})

    # abort: all traffic back on A, B drained, the reason kept
    verb(fleet, "abort", rollout_id)
    view = wait_phase(fleet, rollout_id, "aborted", timeout_s=60)
    assert "test: abort" in view["abort_reason"], view
    wait_acknowledged_on(fleet, {a: 100})

    # retry: the steps again from the first; promote: past the indefinite pause, to 100% on B
    verb(fleet, "retry", rollout_id)
    wait_phase(fleet, rollout_id, "paused", timeout_s=READY_TIMEOUT_S, step_index=4)
    verb(fleet, "promote", rollout_id)
    wait_phase(fleet, rollout_id, "completed", timeout_s=60)
    wait_acknowledged_on(fleet, {b: 100})
    status = json.loads(ok(fleet, "rollout", "status", str(rollout_id), "-o", "json"))
    assert (status["phase"], status["to_ref"]) == ("completed", b)

    # undo: a new rollout back to A with the same steps; promote --full skips them all
    undone = json.loads(ok(fleet, "rollout", "undo", str(rollout_id), "--reason", "test: undo", "-o", "json"))
    assert (undone["from_ref"], undone["to_ref"]) == (b, a), undone
    wait_phase(fleet, undone["id"], "paused", timeout_s=READY_TIMEOUT_S, step_index=2)
    verb(fleet, "promote", undone["id"], "--full")
    wait_phase(fleet, undone["id"], "completed", timeout_s=60)
    wait_acknowledged_on(fleet, {a: 100})
    fleet.wait_drained(b)

    with fleet.client() as api:
        audited = {e.reason for e in api.list_audit(limit=500)
                   if e.action == "rollout.command" and e.target == f"rollouts/{rollout_id}" and e.result == "ok"}
    assert {f"test: {name}" for name in ("pause", "resume", "promote", "abort", "retry", "undo")} <= audited, audited
