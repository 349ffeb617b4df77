"""Bad runbook files are refused with the line that is wrong: the loader maps each schema error to its YAML
node, and validation resolves every command in the real `fleetctl` tree. Through the CLI: one line per
problem, exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from runbook_helpers import ROOT
from typer.testing import CliRunner

from fleetctl.cli.main import app
from fleetctl.runbook.errors import RunbookInvalid
from fleetctl.runbook.load import load_text
from fleetctl.runbook.validate import problems

GOOD = """\
id: good
title: a good one
vars:
  node: {description: the node}
steps:
  - say: "hello {node}"
  - run: fleetctl node cordon {node} --yes
  - check: fleetctl node show {node}
    path: cordoned
    expect: true
"""


def refusal(text: str) -> str:
    with pytest.raises(RunbookInvalid) as refused:
        load_text(text, "rb.yaml")
    return str(refused.value.problems[0])


def found(text: str) -> list[str]:
    return [str(p) for p in problems(load_text(text, "rb.yaml"), ROOT)]


def test_a_good_runbook_has_no_problem() -> None:
    assert found(GOOD) == []


def test_an_unknown_step_kind_is_refused_at_its_line() -> None:
    text = GOOD.replace('  - say: "hello {node}"', '  - shout: "hello {node}"')
    assert refusal(text) == "rb.yaml:6: steps.0: a step has exactly one of the keys say, run, check, ask"


def test_an_unknown_field_of_a_step_is_refused_at_its_line() -> None:
    text = GOOD.replace("    expect: true", "    expect: true\n    timeout: 5")
    assert refusal(text) == ("rb.yaml:11: steps.2.timeout: unknown field 'timeout' "
                             "(a step's kind is one of: say, run, check, ask)")


def test_a_missing_id_is_refused_at_the_top() -> None:
    assert refusal(GOOD.replace("id: good\n", "")) == "rb.yaml:1: missing field 'id'"


def test_a_check_without_expect_is_refused_at_the_step() -> None:
    text = GOOD.replace("    expect: true\n", "")
    assert refusal(text).startswith("rb.yaml:8: steps.2: ") and "expect" in refusal(text)


def test_bad_yaml_is_refused_at_its_line() -> None:
    assert refusal(GOOD + "  - say: [unclosed\n").startswith("rb.yaml:12: invalid YAML:")


def test_a_command_that_does_not_exist_is_refused_at_its_line() -> None:
    text = GOOD.replace("fleetctl node cordon {node} --yes", "fleetctl engine explode {node}")
    assert found(text) == ["rb.yaml:7: steps.1.run: no such command 'fleetctl engine explode'"]


def test_an_option_the_command_does_not_have_is_refused() -> None:
    text = GOOD.replace("--yes", "--yes --force")
    assert found(text) == ["rb.yaml:7: steps.1.run: 'fleetctl node cordon': No such option: --force"]


def test_an_undeclared_variable_is_refused() -> None:
    text = GOOD.replace("node show {node}", "node show {nod}")
    assert found(text) == ["rb.yaml:8: steps.2.check: {nod} is not a declared variable (declare it under vars: node)"]


def test_commands_that_would_ask_or_cannot_give_json_are_refused() -> None:
    text = GOOD.replace("cordon {node} --yes", "cordon {node}").replace("node show {node}", "node cordon {node}")
    assert found(text) == [
        "rb.yaml:7: steps.1.run: 'fleetctl node cordon' asks before it acts: pass --yes (the runbook confirms "
        "each step with the operator)",
        "rb.yaml:8: steps.2.check: a check runs its command with -o json, and 'fleetctl node cordon {node}' takes "
        "no -o: 'fleetctl node cordon': No such option: -o",
    ]


def test_foreground_commands_and_changes_in_preconditions_are_refused() -> None:
    text = GOOD.replace("steps:\n", "preconditions:\n  - run: fleetctl node uncordon {node}\nsteps:\n")
    text = text.replace("fleetctl node cordon {node} --yes", "fleetctl tui")
    assert found(text) == [
        "rb.yaml:6: preconditions.0.run: preconditions change nothing: use say, check or ask (a `run` goes in steps)",
        "rb.yaml:9: steps.1.run: 'fleetctl tui' runs in the foreground until stopped: not a runbook step",
    ]


def test_validate_prints_one_line_per_problem_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(GOOD.replace("id: good", "id: broken").replace("node cordon", "node explode"))
    result = CliRunner().invoke(app, ["runbook", "validate", str(path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {path}:7: steps.1.run: no such command 'fleetctl node explode'"]
    assert "Traceback" not in result.output


def test_run_refuses_a_bad_file_with_its_line_and_runs_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("id: good", "id: bad").replace("  - say:", "  - shout:"))
    result = CliRunner().invoke(app, ["runbook", "run", str(path), "--yes", "--var", "node=n1"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {path}:6: steps.0: a step has exactly one of the keys say, run, check, ask")


def test_the_id_must_match_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "other.yaml"
    path.write_text(GOOD)
    result = CliRunner().invoke(app, ["runbook", "validate", str(path)])
    assert result.exit_code == 2 and f"{path}:1: id: id 'good' differs from the file name 'other.yaml'" in result.stderr
