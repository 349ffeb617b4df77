"""`fleetctl runbook` against a real controller: every shipped runbook validates and dry-runs with its
variables filled; a run executes its steps as `fleetctl` subprocesses against the same controller and
records its start, each step and its finish in the audit log; with the controller unreachable the records
go to a local file; a `--var` the runbook does not declare is refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetctl.cli.main import app
from fleetctl.runbook.load import load_file
from fleetctl.runbook.shipped import shipped
from tests.cli.cli_helpers import Fleet, ok, one_error_line

SHIPPED = shipped()
SAMPLES = {"node": "n1", "model": "smollm2-135m", "known_good": "chat@r1", "class_ref": "chat@r1",
           "prefill": "chat-prefill", "decode": "chat-decode", "prefill_replicas": "2", "decode_replicas": "1",
           "targets": "all"}


def sample_vars(path: Path) -> list[str]:
    """A value for every variable (the questions' answers too: --yes needs them)."""
    names = load_file(path).runbook.vars
    return [arg for name in names for arg in ("--var", f"{name}={SAMPLES.get(name, 'yes')}")]


def test_the_shipped_runbooks_are_the_documented_eight() -> None:
    assert [p.stem for p in SHIPPED] == ["bad-config-pushed", "control-plane-down", "hot-prefix", "kv-transfer-failures",
                                         "node-maintenance", "overload", "pd-imbalance", "quality-drift"]


def test_every_shipped_runbook_validates() -> None:
    result = CliRunner().invoke(app, ["runbook", "validate", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert [row["ok"] for row in json.loads(result.stdout)] == [True] * len(SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_runbook_dry_runs_against_a_fleet(fleet: Fleet, path: Path) -> None:
    result = ok(fleet.run("runbook", "run", path.stem, "--dry-run", "--yes", *sample_vars(path), "-o", "json"))
    shown = json.loads(result.stdout)
    assert shown["outcome"] == "dry_run" and {s["outcome"] for s in shown["steps"]} == {"dry_run"}
    assert not [s["text"] for s in shown["steps"] if "{" in s["text"]]  # every variable filled
    assert [e for e in fleet.client().list_audit() if e.action.startswith("runbook.")] == []  # nothing recorded


def test_show_renders_a_runbook_and_its_json(fleet: Fleet) -> None:
    text = ok(fleet.run("runbook", "show", "node-maintenance")).stdout
    assert text.startswith("node-maintenance: Rolling maintenance") and "rollback:" in text
    assert json.loads(ok(fleet.run("runbook", "show", "node-maintenance", "-o", "json")).stdout)["id"] == "node-maintenance"


RUNBOOK = """\
id: {id}
title: list and check
vars:
  limit: {{description: how many, default: "5"}}
steps:
  - say: "looking"
  - run: fleetctl audit list --limit {{limit}}
  - check: fleetctl node list
    path: "#"
    expect: {nodes}
"""


def write(tmp_path: Path, name: str, nodes: int) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(RUNBOOK.format(id=name, nodes=nodes))
    return path


def test_a_run_executes_its_steps_and_audits_each(fleet: Fleet, tmp_path: Path) -> None:
    path = write(tmp_path, "looks", nodes=0)
    result = ok(fleet.run("runbook", "run", str(path), "--yes", "-o", "json", role="operator"))
    shown = json.loads(result.stdout)
    assert shown["outcome"] == "completed" and [s["outcome"] for s in shown["steps"]] == ["ok", "ok", "ok"]
    events = [e for e in fleet.client().list_audit() if e.action.startswith("runbook.")]
    assert [(e.action, e.code, e.result) for e in events] == [
        ("runbook.start", "started", "ok"), ("runbook.step", "ok", "ok"), ("runbook.step", "ok", "ok"),
        ("runbook.step", "ok", "ok"), ("runbook.finish", "completed", "ok")]
    assert events[2].target == "looks steps.2" and events[2].detail["text"] == "fleetctl audit list --limit 5"
    assert {e.actor.rsplit("-", 1)[0] for e in events} == {"test-operator"}  # the runbook's own token
    assert len({e.detail["run_id"] for e in events}) == 1


def test_a_failed_check_exits_1_and_says_what_next(fleet: Fleet, tmp_path: Path) -> None:
    path = write(tmp_path, "fails", nodes=3)
    result = fleet.run("runbook", "run", str(path), "--yes")
    assert result.exit_code == 1
    assert "stopped at steps step 3 (check): #: got 0, want == 3" in result.stderr
    assert "next: the runbook stopped at steps step 3 (check)" in result.stderr
    finish = [e for e in fleet.client().list_audit() if e.action == "runbook.finish"]
    assert [(e.code, e.result) for e in finish] == [("failed", "error")]


def test_an_unknown_var_is_refused_naming_it(fleet: Fleet) -> None:
    result = fleet.run("runbook", "run", "node-maintenance", "--yes", "--var", "nodes=n1")
    assert result.exit_code == 2
    assert one_error_line(result) == ("error: --var nodes: runbook 'node-maintenance' has no variable 'nodes' "
                                      "(it has: drain_timeout, node, upgraded)")


def test_yes_needs_every_answer_up_front(fleet: Fleet) -> None:
    result = fleet.run("runbook", "run", "node-maintenance", "--yes", "--var", "node=n1")
    assert result.exit_code == 2
    assert one_error_line(result).startswith("error: --yes needs every variable: --var upgraded=...")


def test_with_the_controller_down_the_records_go_to_a_local_file(tmp_path: Path) -> None:
    path = tmp_path / "talks.yaml"
    path.write_text("id: talks\ntitle: only talks\nsteps:\n  - say: hello\n")
    result = CliRunner().invoke(app, ["--controller", "http://127.0.0.1:9", "--request-timeout", "2", "runbook", "run",
                                      str(path), "--yes"], env={"FLEET_STATE_DIR": str(tmp_path / "state")})
    assert result.exit_code == 0, result.output
    assert "warning: the controller cannot record this run" in result.stderr
    records = [json.loads(line) for line in (tmp_path / "state" / "runbook-audit.jsonl").read_text().splitlines()]
    assert [(r["event"], r["outcome"]) for r in records] == [("start", "started"), ("step", "ok"), ("finish", "completed")]


def test_interactively_each_step_is_confirmed_and_abort_stops_the_run(fleet: Fleet, tmp_path: Path) -> None:
    path = write(tmp_path, "asks", nodes=0)
    result = fleet.run("runbook", "run", str(path), "-o", "json", input="s\na\n")
    assert result.exit_code == 1, result.output
    # the prompts went to stderr; CliRunner echoes the typed answers to stdout, where a terminal shows them
    shown = json.loads(result.stdout[result.stdout.index("{"):])
    assert [s["outcome"] for s in shown["steps"]] == ["ok", "skipped", "aborted"] and shown["outcome"] == "aborted"
    assert "run it? [y]es, [s]kip, [a]bort" in result.stderr
    steps = [e.code for e in fleet.client().list_audit() if e.action == "runbook.step"]
    assert steps == ["ok", "skipped", "aborted"]
