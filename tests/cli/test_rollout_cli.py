"""`fleetctl rollout ...` end to end against a real controller on loopback (its reconcilers run in the
background), with the traffic tests' minimal agent loop, which reports every assigned engine ready: start from flags and from
a file, status and list, pause/resume/promote/abort/retry/undo and history by id or model; bad specs are one
line and exit 2 with nothing stored; a second rollout of the model is refused naming the first."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import Fleet, ok, one_error_line
from traffic_helpers import MODEL, SPEC, agent

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.rollout_cmd import parse_steps, spec_from_flags
from fleetctl.errors import ValidationFailed

@pytest.fixture
def served(fleet: Fleet) -> Iterator[Fleet]:
    """chat@r1 serving MODEL with all its traffic, chat@r2 applied (performance-only difference)."""
    with fleet.client("operator") as api, agent(fleet, engines=8):
        api.apply_class("chat", SPEC)
        api.apply_class("chat", {**SPEC, "max_num_seqs": 128})
        api.set_deployment("chat", "chat@r1", 1)
        wait_for(lambda: api.get_traffic(MODEL).revisions[0].ready_engines == 1)
        api.set_traffic(MODEL, {"chat@r1": 100})
        yield fleet


def wait_for(condition: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def status(fleet: Fleet, target: str) -> dict[str, Any]:
    return json.loads(ok(fleet.run("rollout", "status", target, "-o", "json", role="viewer")).stdout)


def phase_becomes(fleet: Fleet, target: str, phase: str) -> dict[str, Any]:
    return wait_for(lambda: (view := status(fleet, target))["phase"] == phase and view)


def test_flags_build_scale_then_weights_with_pauses_ending_at_100() -> None:
    assert spec_from_flags(MODEL, "chat@r2", [10, 50], "2m") == {"model": MODEL, "to": "chat@r2", "steps": [
        {"scale": {}}, {"setWeight": 10}, {"pause": {"duration": "2m"}}, {"setWeight": 50},
        {"pause": {"duration": "2m"}}, {"setWeight": 100}]}
    built = spec_from_flags(MODEL, "chat@r2", [100], None, allow_correctness_change="why", templates={"t": {}})
    assert built["steps"] == [{"scale": {}}, {"setWeight": 100}]
    assert built["allowCorrectnessChange"] == {"reason": "why"} and built["analysis"]["templates"] == ["t"]
    with pytest.raises(ValidationFailed, match="--steps"):
        parse_steps("10,half")


def test_a_rollout_driven_from_the_cli_by_model_and_id(served: Fleet) -> None:
    fleet = served
    started = ok(fleet.run("rollout", "start", MODEL, "--to", "chat@r2", "--steps", "50", "--pause", "1h",
                           "--reason", "bigger batches", role="operator"))
    assert "rollout 1 started: smollm2-135m chat@r1 -> chat@r2" in started.stderr
    assert "▶ 0: scale" in started.stdout
    paused = phase_becomes(fleet, MODEL, "paused")
    assert (paused["step_index"], paused["pause_reason"]) == (2, "CanaryPauseStep")
    assert [s["text"] for s in paused["steps"]] == ["scale (as many engines as A has)", "setWeight 50", "pause 1h",
                                                    "setWeight 100"]
    held = ok(fleet.run("rollout", "pause", MODEL, "--reason", "lunch", role="operator"))
    assert "rollout 1: pause -> paused" in held.stderr and status(fleet, "1")["paused_by"].startswith("test-operator-")
    ok(fleet.run("rollout", "resume", "1", "--reason", "back", role="operator"))
    ok(fleet.run("rollout", "promote", MODEL, "--reason", "looks good", role="operator"))
    done = phase_becomes(fleet, "1", "completed")
    assert {ref: w for ref, w in done["weights"].items() if w > 0} == {"chat@r2": 100.0}
    events = ok(fleet.run("rollout", "history", MODEL, role="viewer")).stdout
    assert "paused" in events and "promoted" in events and "completed" in events
    undone = ok(fleet.run("rollout", "undo", MODEL, "--reason", "roll back", role="operator"))
    assert "rollout 1 undone by rollout 2: chat@r2 -> chat@r1" in undone.stderr
    ok(fleet.run("rollout", "abort", "2", "--reason", "changed my mind", role="operator"))
    aborted = phase_becomes(fleet, "2", "aborted")
    assert aborted["abort_reason"].endswith("changed my mind")
    ok(fleet.run("rollout", "retry", MODEL, "--reason", "again", role="operator"))
    assert status(fleet, MODEL)["id"] == 2
    listed = json.loads(ok(fleet.run("rollout", "list", "-o", "json", role="viewer")).stdout)
    assert [(r["id"], r["from_ref"], r["to_ref"]) for r in listed] == [(1, "chat@r1", "chat@r2"), (2, "chat@r2", "chat@r1")]
    audit = fleet.client("viewer").list_audit()
    reasons = [e.reason for e in audit if e.action == "rollout.command"]
    assert reasons == ["lunch", "back", "looks good", "roll back", "changed my mind", "again"]


BAD_FILES = [
    ({"to": "chat@r9"}, "spec.to"),
    ({"steps": [{"setWeight": 120}]}, "spec.steps.0.setWeight"),
    ({"steps": [{"setWeight": 60}, {"setWeight": 20}]}, "spec.steps.1.setWeight"),
    ({"steps": [{"bake": {}}]}, "spec.steps.0"),
    ({"steps": [{"pause": {"duration": "-1m"}}]}, "spec.steps.0.pause.duration"),
    ({"steps": [{"analysis": {"templates": ["t"]}}],
      "templates": {"t": {"metrics": [{"name": "m", "measure": "vibes", "successCondition": "result < 1"}]}}},
     "spec.templates.t.metrics.0.measure"),
]


def test_bad_specs_are_one_line_exit_2_and_nothing_is_stored(served: Fleet, tmp_path: Path) -> None:
    for index, (changes, field) in enumerate(BAD_FILES):
        path = tmp_path / f"bad-{index}.yaml"
        path.write_text(yaml.safe_dump({"model": MODEL, "to": "chat@r2", "steps": [{"setWeight": 100}], **changes}))
        result = served.run("rollout", "start", "-f", str(path), "--reason", "bad", role="operator")
        assert result.exit_code == ExitCode.USAGE, (field, result.output)
        assert one_error_line(result).startswith(f"error: {field}: "), field
    not_yaml = tmp_path / "list.yaml"
    not_yaml.write_text("- just\n- a list\n")
    assert served.run("rollout", "start", "-f", str(not_yaml), role="operator").exit_code == ExitCode.USAGE
    assert served.run("rollout", "start", MODEL, "--to", "chat@r2", "--steps", "ten", role="operator").exit_code == ExitCode.USAGE
    assert json.loads(ok(served.run("rollout", "list", "-o", "json", role="viewer")).stdout) == []


def test_a_second_rollout_is_refused_naming_the_running_one(served: Fleet, tmp_path: Path) -> None:
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump({"model": MODEL, "to": "chat@r2", "steps": [{"scale": {}}, {"pause": {}}]}))
    ok(served.run("rollout", "start", "-f", str(path), "--reason", "first", role="operator"))
    second = served.run("rollout", "start", "-f", str(path), "--reason", "second", role="operator")
    assert second.exit_code == ExitCode.REFUSED
    assert "rollout 1 of 'smollm2-135m'" in one_error_line(second)
    missing = served.run("rollout", "status", "other-model", role="viewer")
    assert missing.exit_code == ExitCode.NOT_FOUND and "no rollout of model" in one_error_line(missing)
