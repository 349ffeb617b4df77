"""`fleetctl class diff A B`: the verdict (pure), and the command over files and stored revisions, with its
exit codes: 0 when outputs cannot change, 7 (DIFFERS) when they may, 3 for an unknown revision, 2 for a bad
file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import Fleet, ok, one_error_line
from typer.testing import CliRunner, Result

from fleetctl.class_diff import IDENTICAL, OUTPUTS_MAY_CHANGE, OUTPUTS_UNCHANGED, compare
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app
from fleetctl.controller.server import free_port
from fleetctl.replica_class import ReplicaClassSpec

BASE = {"model": "smollm2-135m", "weights": "smollm2"}


def spec(**fields: Any) -> ReplicaClassSpec:
    return ReplicaClassSpec(**BASE, **fields)


# --- the verdict (pure) ---

def test_correctness_changes_mean_outputs_may_change() -> None:
    result = compare("a", spec(kv_cache_dtype="float32", max_model_len=8192, max_num_seqs=64),
                     "b", spec(kv_cache_dtype="bfloat16", max_model_len=32768, max_num_seqs=128))
    assert result.verdict == OUTPUTS_MAY_CHANGE and result.outputs_may_change
    assert result.verdict_line() == "outputs may change: kv_cache_dtype float32 → bfloat16, max_model_len 8192 → 32768"
    assert [c.field for c in result.performance] == ["max_num_seqs"]


def test_performance_changes_leave_outputs_unchanged() -> None:
    result = compare("a", spec(), "b", spec(max_num_seqs=128, engine_args={"enforce-eager": True}))
    assert result.verdict == OUTPUTS_UNCHANGED and not result.outputs_may_change
    assert result.verdict_line() == (
        "outputs unchanged: only performance fields differ (engine_args.enforce-eager unset → true, max_num_seqs 64 → 128)")


def test_identical_specs() -> None:
    result = compare("a", spec(), "b", spec(dtype="float32"))  # a default spelled out is the same spec
    assert (result.verdict, result.verdict_line(), result.correctness, result.performance) == (IDENTICAL, IDENTICAL, (), ())


def test_an_unknown_engine_flag_counts_as_correctness() -> None:
    result = compare("a", spec(engine_args={"enforce-eager": True}),
                     "b", spec(engine_args={"enforce-eager": True, "quantization": "awq"}))
    assert result.verdict_line() == "outputs may change: engine_args.quantization unset → awq"
    assert result.to_json()["correctness"] == [
        {"field": "engine_args.quantization", "tag": "correctness", "old": None, "new": "awq"}]


# --- the command over files (no controller needed) ---

def write(tmp_path: Path, name: str, document: Any) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document) if not isinstance(document, str) else document)
    return str(path)


def run(*args: str) -> Result:
    controller = f"http://127.0.0.1:{free_port()}"  # never reached when both sides are files
    return CliRunner().invoke(app, ["--controller", controller, "--token", "t", "class", "diff", *args])


def test_files_correctness_change_exits_differs(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", {"name": "chat", "spec": {**BASE, "kv_cache_dtype": "float32"}})  # as `class apply`
    b = write(tmp_path, "b.json", json.dumps({**BASE, "kv_cache_dtype": "bfloat16", "max_num_seqs": 128}))  # a bare spec
    table = run(a, b)
    assert table.exit_code == ExitCode.DIFFERS == 7, table.output
    assert table.stdout.splitlines() == [
        f"A: {a}", f"B: {b}", "",
        "correctness-relevant (can change tokens):", "  ! kv_cache_dtype: float32 → bfloat16", "",
        "performance-only (cannot change tokens):", "    max_num_seqs: 64 → 128", "",
        "outputs may change: kv_cache_dtype float32 → bfloat16",
    ]
    document = json.loads(run(a, b, "-o", "json").stdout)
    assert (document["verdict"], document["a"], document["b"]) == (OUTPUTS_MAY_CHANGE, a, b)
    assert document["correctness"] == [{"field": "kv_cache_dtype", "tag": "correctness", "old": "float32", "new": "bfloat16"}]
    assert document["performance"] == [{"field": "max_num_seqs", "tag": "performance", "old": 64, "new": 128}]
    assert yaml.safe_load(run(a, b, "-o", "yaml").stdout)["summary"] == "outputs may change: kv_cache_dtype float32 → bfloat16"


def test_files_performance_change_exits_0(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", BASE)
    b = write(tmp_path, "b.yaml", {**BASE, "max_num_seqs": 128, "engine_args": {"debug-step-delay-ms": 20}})
    result = ok(run(a, b))
    assert result.stdout.splitlines()[-1] == (
        "outputs unchanged: only performance fields differ (engine_args.debug-step-delay-ms unset → 20, max_num_seqs 64 → 128)")
    assert "correctness-relevant" not in result.stdout
    assert ok(run(a, a, "-o", "json")).stdout and json.loads(run(a, a, "-o", "json").stdout)["verdict"] == IDENTICAL


BAD_FILES = [
    ("not-a-mapping.yaml", "- 1\n- 2\n", "expected a mapping"),
    ("blank-field.yaml", yaml.safe_dump({**BASE, "model": " "}), "spec.model: must not be blank"),
    ("wrong-type.yaml", yaml.safe_dump({**BASE, "max_model_len": "long"}), "spec.max_model_len:"),
    ("unknown-field.yaml", yaml.safe_dump({**BASE, "colour": "blue"}), "spec.colour: Extra inputs are not permitted"),
    ("bad-envelope.yaml", yaml.safe_dump({"name": "chat", "spec": {**BASE}, "extra": 1}), "unknown top-level field 'extra'"),
    ("broken.yaml", "model: [unclosed\n", "invalid YAML"),
]


@pytest.mark.parametrize(("name", "text", "says"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_an_invalid_file_is_a_usage_error_naming_the_field(tmp_path: Path, name: str, text: str, says: str) -> None:
    good = write(tmp_path, "good.yaml", BASE)
    result = run(good, write(tmp_path, name, text))
    assert result.exit_code == ExitCode.USAGE
    assert says in one_error_line(result)


def test_neither_a_file_nor_a_revision_is_a_usage_error(tmp_path: Path) -> None:
    result = run(write(tmp_path, "good.yaml", BASE), str(tmp_path / "missing.yaml"))
    assert result.exit_code == ExitCode.USAGE
    assert one_error_line(result).endswith("missing.yaml: neither a class revision NAME@rN nor an existing file")


# --- the command over stored revisions ---

def test_revisions_and_files_mixed(fleet: Fleet, tmp_path: Path) -> None:
    with fleet.client() as client:
        client.apply_class("chat", BASE)
        client.apply_class("chat", {**BASE, "max_num_seqs": 128})
        client.apply_class("chat", {**BASE, "max_num_seqs": 128, "engine_version": "0.1.0"})
    perf = ok(fleet.run("class", "diff", "chat@r1", "chat@r2", role="viewer"))
    assert perf.stdout.splitlines()[:2] == ["A: chat@r1", "B: chat@r2"]
    assert perf.stdout.splitlines()[-1] == "outputs unchanged: only performance fields differ (max_num_seqs 64 → 128)"
    pinned = fleet.run("class", "diff", "chat@r2", "chat@r3", "-o", "json", role="viewer")
    assert pinned.exit_code == ExitCode.DIFFERS
    assert json.loads(pinned.stdout)["summary"] == "outputs may change: engine_version unset → 0.1.0"
    same = ok(fleet.run("class", "diff", write(tmp_path, "r2.yaml", {"name": "x", "spec": {**BASE, "max_num_seqs": 128}}),
                        "chat@r2", role="viewer"))
    assert same.stdout.splitlines()[-1] == IDENTICAL


def test_an_unknown_revision_is_not_found(fleet: Fleet) -> None:
    with fleet.client() as client:
        client.apply_class("chat", BASE)
    result = fleet.run("class", "diff", "chat@r1", "chat@r9", role="viewer")
    assert result.exit_code == ExitCode.NOT_FOUND
    assert "chat@r9" in one_error_line(result)
