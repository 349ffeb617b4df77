"""Rollouts on a live fleet (a real controller on SQLite, two agents with tiny engines, a gateway) under
steady load: a full rollout drops nothing; a latency regression aborts at its analysis step and restores A;
a controller killed mid-rollout continues from the same step; a bad spec is refused whole; a second
rollout of the model is refused.

The module shares one fleet. Each test leaves no rollout running and all traffic on one revision (which
one, `fleet.current()` says); a rollout goes from it to `fleet.other()`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from rollout_api import (errors_template, get, history, latency_template, list_all, make_steps, rollout_ids, spec,
                         start, step_starts, wait_acknowledged_on, wait_phase)
from rollout_fleet import READY_TIMEOUT_S, RolloutFleet, wait_until
from rollout_load import Load, describe

from fleetctl.cli.exit_codes import ExitCode

pytestmark = pytest.mark.slow


def deployments(fleet: RolloutFleet) -> list[tuple[str, str, int]]:
    with fleet.client() as api:
        return sorted((d.name, d.class_ref, d.replicas) for d in api.list_deployments())


def test_fleet_serves_a_under_load(fleet):
    with Load(fleet.gateway_url) as load:
        load.wait_for(10)
    outcomes = load.snapshot()
    assert outcomes and all(o.ok for o in outcomes), describe(outcomes)
    assert {o.class_ref for o in outcomes} == {fleet.refs["A"]}
    assert all(o.ttft_s is not None and o.engine for o in outcomes)
    assert fleet.weights() == {fleet.refs["A"]: 100}


# --- bad specs: refused whole through the CLI, nothing stored ---

GOOD_LATENCY = latency_template()
BAD_SPECS = {
    "unknown revision": ({"to": "tiny@r99"}, "to"),
    "weight above 100": ({"steps": [{"setWeight": 150}]}, "setWeight"),
    "weight below 0": ({"steps": [{"setWeight": -5}]}, "setWeight"),
    "weights decreasing": ({"steps": [{"setWeight": 50}, {"setWeight": 20}]}, "steps.1.setWeight"),
    "unknown step type": ({"steps": [{"setWeight": 10}, {"experiment": {"duration": "1m"}}]}, "experiment"),
    "negative pause": ({"steps": [{"setWeight": 10}, {"pause": {"duration": "-1m"}}]}, "pause"),
    "unknown metric": ({"steps": [{"setWeight": 10}, {"analysis": {"templates": ["latency"]}}],
                        "templates": {"latency": {"metrics": [{**GOOD_LATENCY["metrics"][0], "measure": "ttft_p95_s"}]}}},
                       "measure"),
    "unknown template": ({"steps": [{"setWeight": 10}, {"analysis": {"templates": ["nope"]}}]}, "templates"),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_bad_spec_refused_with_nothing_stored(fleet, tmp_path: Path, case: str):
    change, field = BAD_SPECS[case]
    body = {**spec(fleet.refs["B"], make_steps("scale", 50, 100)), **change}
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(body))
    before = (fleet.weights(), deployments(fleet), rollout_ids(fleet))

    result = fleet.cli("rollout", "start", "-f", str(path), "--reason", f"test: {case}")

    assert result.returncode == ExitCode.USAGE, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert field in lines[0], lines[0]
    assert (fleet.weights(), deployments(fleet), rollout_ids(fleet)) == before


def test_bad_spec_is_a_422_naming_the_field(fleet):
    body = {**spec(fleet.refs["B"], make_steps(50, 100)), "steps": [{"pause": {"duration": "-1m"}}]}
    before = rollout_ids(fleet)
    response = fleet.http("POST", "/api/v1/rollouts", {"spec": body, "reason": "test: bad pause"})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "steps.0.pause" in (error.get("field") or "") + error["message"], error
    assert rollout_ids(fleet) == before


# --- a full rollout under load ---

def test_full_rollout_under_load_drops_nothing(fleet):
    a, b = fleet.current(), fleet.other()
    steps = make_steps("scale", 25, ("pause", "1s"), 50, ("analysis", ["latency"]), 100)
    body = spec(b, steps, templates={"latency": latency_template(), "errors": errors_template()},
                analysis={"templates": ["errors"], "startingStep": 2})  # from the pause after B's first traffic
    with Load(fleet.gateway_url, workers=4) as load:
        load.wait_for(5)
        rollout = start(fleet, body, reason="test: full rollout")
        view = wait_phase(fleet, rollout["id"], "completed", timeout_s=READY_TIMEOUT_S)
        wait_acknowledged_on(fleet, {b: 100})
        acknowledged = time.monotonic()
        wait_until(lambda: len(load.since(acknowledged)) >= 6, 30, "requests after the rollout completed")
        fleet.wait_drained(a)
    outcomes = load.snapshot()
    assert load.failures() == [], describe(outcomes)
    served = {o.class_ref for o in outcomes}
    assert served == {a, b}, describe(outcomes)
    assert {o.class_ref for o in load.since(acknowledged)} == {b}
    assert view["weight"] == 100 and view["progress"] == 1.0
    assert step_starts(history(fleet, rollout["id"])) == list(range(len(steps)))


# --- an injected latency regression ---

def test_latency_regression_aborts_at_analysis_and_restores_a(fleet):
    a, slow = fleet.current(), fleet.refs["SLOW"]
    steps = make_steps("scale", 50, ("analysis", ["latency"]), 100)
    # the gate above, over 2-second windows: a slow request takes a while to be answered and counted
    body = spec(slow, steps, templates={"latency": latency_template(interval="2s", min_requests=2)}, replicas=1)
    with Load(fleet.gateway_url, workers=8, max_tokens=2) as load:
        load.wait_for(5)
        rollout = start(fleet, body, reason="test: a slow revision")
        view = wait_phase(fleet, rollout["id"], "aborted", timeout_s=READY_TIMEOUT_S)
        wait_acknowledged_on(fleet, {a: 100})
        acknowledged = time.monotonic()
        wait_until(lambda: len(load.since(acknowledged)) >= 6, 30, "requests after the abort")
        fleet.wait_drained(slow)
    outcomes = load.snapshot()
    assert view["step_index"] == 2, view  # the analysis step: it never went on to 100
    assert view["abort_reason"] and "ttft" in view["abort_reason"].lower(), view
    failed = [g for g in view["gates"] if g["phase"] == "Failed"]
    assert failed and failed[0]["latest"]["value"] > failed[0]["latest"]["threshold"], view["gates"]
    assert {o.class_ref for o in outcomes} == {a, slow}, describe(outcomes)
    assert {o.class_ref for o in load.since(acknowledged)} == {a}
    assert load.failures() == [], describe(outcomes)
    assert get(fleet, rollout["id"])["desired"].get(slow, 0) == 0


# --- one rollout per model ---

def test_second_rollout_of_the_model_refused(fleet, tmp_path: Path):
    target = fleet.other()
    first = start(fleet, spec(target, make_steps(("pause", None), 100)), reason="test: first")
    try:
        wait_phase(fleet, first["id"], "paused", timeout_s=30)
        response = fleet.http("POST", "/api/v1/rollouts", {"spec": spec(target, make_steps(100)), "reason": "test: second"})
        assert response.status_code == 409, response.text
        assert str(first["id"]) in response.json()["error"]["message"]

        path = tmp_path / "second.yaml"
        path.write_text(yaml.safe_dump(spec(target, make_steps(100))))
        result = fleet.cli("rollout", "start", "-f", str(path), "--reason", "test: second from the CLI")
        assert result.returncode == ExitCode.REFUSED, (result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and str(first["id"]) in result.stderr, result.stderr
        assert [r["id"] for r in list_all(fleet) if r["phase"] not in ("completed", "aborted")] == [first["id"]]
    finally:
        fleet.http("POST", f"/api/v1/rollouts/{first['id']}/abort", {"reason": "test: done"})
    wait_phase(fleet, first["id"], "aborted", timeout_s=60)


# --- the controller killed mid-rollout ---

def test_controller_killed_mid_rollout_continues_from_the_same_step(fleet):
    a, b = fleet.current(), fleet.other()
    steps = make_steps("scale", 30, ("pause", "3s"), 70, ("pause", None), 100)
    with Load(fleet.gateway_url) as load:
        rollout = start(fleet, spec(b, steps), reason="test: controller crash")
        wait_phase(fleet, rollout["id"], ("paused", "progressing"), timeout_s=READY_TIMEOUT_S, step_index=2)
        fleet.kill_controller(0)
        down_at = time.monotonic()
        wait_until(lambda: len(load.since(down_at)) >= 4, 30, "requests served while the controller is down")
        fleet.restart_controller(0)
        view = wait_phase(fleet, rollout["id"], "paused", timeout_s=60, step_index=4)
        assert view["pause_reason"] == "CanaryPauseStep", view
        assert fleet.weights() == {a: 30, b: 70}
        fleet.http("POST", f"/api/v1/rollouts/{rollout['id']}/promote", {"reason": "test: go on"})
        wait_phase(fleet, rollout["id"], "completed", timeout_s=60)
        wait_acknowledged_on(fleet, {b: 100})
    assert load.failures() == [], describe(load.snapshot())
    assert step_starts(history(fleet, rollout["id"])) == list(range(len(steps)))
    fleet.wait_drained(a)
