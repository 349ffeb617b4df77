"""`fleetctl canary record|references|golden check` against a real controller (SQLite and PostgreSQL): a bad
golden file, a set for another model, or an unreachable gateway is one line and a non-zero exit with nothing
stored; `golden check` validates offline; `references` lists what is stored. Recording itself, through a real
gateway and engine, is tests/canary/test_canary_probe_process.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from cli_helpers import Fleet, ok, one_error_line
from typer.testing import CliRunner

from agent.ports import free_port
from fleetctl.canary.golden import load_golden, shipped_golden
from fleetctl.canary.types import ConditionNoise, PromptReference, Reference
from fleetctl.cli.main import app
from fleetctl.replica_class import ReplicaClassSpec, correctness_digest

TINY = {"model": "tiny", "weights": "tiny"}


def bad_file(tmp_path: Path) -> Path:
    document = load_golden(shipped_golden("tiny")).model_dump(mode="json", exclude_defaults=True)
    document["prompts"][3]["prompt"] = "a completion too"  # chat-arithmetic: now both
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def nothing_stored(fleet: Fleet) -> bool:
    with fleet.client("viewer") as api:
        return api.list_golden_sets() == [] and api.list_references() == []


def test_a_bad_file_is_one_line_exit_2_and_nothing_is_stored(fleet: Fleet, tmp_path: Path) -> None:
    fleet.client().apply_class("tiny", TINY)
    result = fleet.run("canary", "record", "--class", "tiny@r1", "--golden", str(bad_file(tmp_path)),
                       "--gateway", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2
    assert one_error_line(result) == ("error: golden set bad.yaml: prompts[3] (id 'chat-arithmetic'): messages and "
                                      "prompt are exclusive")
    assert nothing_stored(fleet)


def test_a_set_for_another_model_is_refused_before_the_gateway_is_asked(fleet: Fleet) -> None:
    fleet.client().apply_class("chat", {"model": "smollm2-135m", "weights": "smollm2"})
    result = fleet.run("canary", "record", "--class", "chat@r1", "--golden", "tiny",
                       "--gateway", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2
    assert one_error_line(result) == "error: golden set tiny.yaml: model: the set is for 'tiny', the class serves 'smollm2-135m'"
    assert nothing_stored(fleet)


def test_an_unreachable_gateway_stores_nothing(fleet: Fleet) -> None:
    fleet.client().apply_class("tiny", TINY)
    result = fleet.run("canary", "record", "--class", "tiny", "--golden", "tiny",
                       "--gateway", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 1
    assert "unreachable" in one_error_line(result)
    assert nothing_stored(fleet)


def test_an_unknown_class_is_not_found(fleet: Fleet) -> None:
    result = fleet.run("canary", "record", "--class", "nope@r1", "--golden", "tiny")
    assert result.exit_code == 3 and "nope@r1" in one_error_line(result)


def test_golden_check_validates_offline(tmp_path: Path) -> None:
    good = ok(CliRunner().invoke(app, ["canary", "golden", "check", "smollm2"]))
    assert good.stdout.startswith("golden set smollm2 v1 for smollm2-135m: 24 prompts")
    summary = json.loads(ok(CliRunner().invoke(app, ["canary", "golden", "check", "tiny", "-o", "json"])).stdout)
    assert (summary["prompts"], summary["seeded"], summary["expected"]) == (12, 2, 0)
    bad = CliRunner().invoke(app, ["canary", "golden", "check", str(bad_file(tmp_path))])
    assert bad.exit_code == 2 and "prompts[3] (id 'chat-arithmetic')" in one_error_line(bad)
    missing = CliRunner().invoke(app, ["canary", "golden", "check", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2 and "golden set none.yaml: cannot be read" in one_error_line(missing)


def test_references_lists_what_is_stored(fleet: Fleet) -> None:
    api = fleet.client()
    api.apply_class("tiny", TINY)
    golden = load_golden(shipped_golden("tiny"))
    api.put_golden_set(golden.model_dump(mode="json"))
    prompts = {p.id: PromptReference(prompt_id=p.id, tokens=[1], text="x", top_logprobs=[[(1, -0.5)]],
                                     noise={1: ConditionNoise(runs=2, diverged=0), 4: ConditionNoise(runs=2, diverged=1)})
               for p in golden.prompts}
    api.put_reference(Reference(golden_set="tiny", golden_version=1, model="tiny", class_ref="tiny@r1",
                                correctness_digest=correctness_digest(ReplicaClassSpec.model_validate(TINY)),
                                recorded_at="2026-01-01T00:00:00Z", recorded_by="t", prompts=prompts).model_dump(mode="json"))
    table = ok(fleet.run("canary", "references", role="viewer")).stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "MODEL", "CLASS", "GOLDEN", "PROMPTS"]
    assert table[1].split()[:8] == ["1", "tiny", "tiny@r1", "tiny", "v1", "12", "b1:0/24", "b4:12/24"]
    listed = json.loads(ok(fleet.run("canary", "references", "tiny", "-o", "json", role="viewer")).stdout)
    assert [(r["class_ref"], r["prompts"]) for r in listed] == [("tiny@r1", 12)]
    assert json.loads(ok(fleet.run("canary", "references", "other", "-o", "json", role="viewer")).stdout) == []
