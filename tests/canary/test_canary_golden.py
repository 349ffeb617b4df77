"""Golden-set files: the shipped sets load (and ship in the wheel); every kind of bad file is refused with one
line naming the file, the entry and the field; a set is checked against the class it is recorded on (its
model, its context window); the digest follows the content."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl.canary.golden import (
    GoldenSetError, check_against_class, golden_digest, load_golden, parse_golden, shipped_golden, shipped_golden_names,
)
from fleetctl.errors import ValidationFailed
from fleetctl.replica_class import ReplicaClassSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
HEADER = {"name": "mini", "version": 1, "model": "tiny"}
CHAT = {"id": "hello", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"id": "river", "prompt": "The river runs", "sampling": {"max_tokens": 8}}


def write(tmp_path: Path, document: Any, name: str = "mini.yaml") -> Path:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return path


def refusal(tmp_path: Path, document: Any, name: str = "mini.yaml") -> GoldenSetError:
    with pytest.raises(GoldenSetError) as caught:
        load_golden(write(tmp_path, document, name))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"golden set {name}: "), message
    return caught.value


# --- the shipped sets ---

@pytest.mark.parametrize("name, model, at_least", [("smollm2", "smollm2-135m", 16), ("tiny", "tiny", 10)])
def test_the_shipped_sets_load(name: str, model: str, at_least: int) -> None:
    golden = load_golden(shipped_golden(name))
    assert (golden.name, golden.model) == (name, model) and len(golden.prompts) >= at_least
    chat = [p for p in golden.prompts if p.messages is not None]
    completion = [p for p in golden.prompts if p.prompt is not None]
    seeded = [p for p in golden.prompts if p.sampling.temperature > 0]
    assert chat and completion and 2 <= len(seeded) <= 3
    assert all(p.sampling.seed is not None for p in seeded)
    assert max(p.sampling.max_tokens for p in golden.prompts) >= 48  # a long answer
    assert shipped_golden(f"{name}.yaml") == shipped_golden(name)


def test_the_smollm2_set_has_checkable_tasks_and_the_tiny_set_no_expected_answers() -> None:
    smollm2 = load_golden(shipped_golden("smollm2"))
    assert {"arithmetic", "fact", "extraction", "code", "instruction"} <= {p.task for p in smollm2.prompts}
    assert sum(p.expected is not None for p in smollm2.prompts) >= 12
    assert all(p.expected is None for p in load_golden(shipped_golden("tiny")).prompts)


def test_the_shipped_sets_are_package_data() -> None:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["fleetctl.canary"]
    shipped = {p.name for pattern in patterns for p in (REPO_ROOT / "fleetctl" / "canary").glob(pattern)}
    assert shipped == {"smollm2.yaml", "smollm2-quick.yaml", "tiny.yaml"}
    assert shipped_golden_names() == ["smollm2", "smollm2-quick", "tiny"]


def test_an_unknown_shipped_name_lists_the_shipped_ones() -> None:
    with pytest.raises(GoldenSetError, match="shipped: smollm2, smollm2-quick, tiny"):
        shipped_golden("nope")


# --- formats ---

def test_jsonl_is_the_header_then_one_prompt_a_line(tmp_path: Path) -> None:
    text = "\n".join(json.dumps(row) for row in (HEADER, CHAT, {}, COMPLETION)).replace("\n{}\n", "\n\n")
    golden = load_golden(write(tmp_path, text, "mini.jsonl"))
    assert [p.id for p in golden.prompts] == ["hello", "river"] and golden.prompts[1].sampling.max_tokens == 8
    assert golden == load_golden(write(tmp_path, {**HEADER, "prompts": [CHAT, COMPLETION]}))


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    error = refusal(tmp_path, json.dumps(HEADER) + "\n{not json\n", "mini.jsonl")
    assert "line 2: invalid JSON" in str(error)
    assert "header line must not hold prompts" in str(refusal(tmp_path, json.dumps({**HEADER, "prompts": []}), "mini.jsonl"))


# --- bad files, each named ---

BAD_PROMPTS = [
    ({"id": "both", "messages": CHAT["messages"], "prompt": "x"}, "prompts[1] (id 'both'): messages and prompt are exclusive",
     "prompts.1.messages"),
    ({"id": "neither"}, "prompts[1] (id 'neither'): needs messages (chat) or prompt (completion)", "prompts.1.messages"),
    ({"prompt": "x"}, "prompts[1]: id: required", "prompts.1.id"),
    ({**COMPLETION, "colour": "red"}, "prompts[1] (id 'river'): colour: unknown field", "prompts.1.colour"),
    ({**COMPLETION, "sampling": {"max_tokens": 8, "top_k": 3}}, "prompts[1] (id 'river'): sampling.top_k: unknown field",
     "prompts.1.sampling.top_k"),
    ({"id": "role", "messages": [{"role": "robot", "content": "hi"}]},
     "prompts[1] (id 'role'): messages[0].role: 'robot' is not one of assistant, system, user", "prompts.1.messages.0.role"),
    ({"id": "keys", "messages": [{"role": "user", "text": "hi"}]}, "prompts[1] (id 'keys'): messages[0]: needs exactly "
     "role and content", "prompts.1.messages.0"),
    ({"id": "empty-chat", "messages": []}, "prompts[1] (id 'empty-chat'): messages: must not be empty", "prompts.1.messages"),
    ({"id": "hot", "prompt": "x", "sampling": {"temperature": 0.7}},
     "prompts[1] (id 'hot'): sampling.seed: required when temperature > 0", "prompts.1.sampling.seed"),
    ({"id": "too-hot", "prompt": "x", "sampling": {"temperature": 3, "seed": 1}},
     "prompts[1] (id 'too-hot'): sampling.temperature: Input should be less than or equal to 2",
     "prompts.1.sampling.temperature"),
    ({"id": "two", "prompt": "x", "expected": {"exact": "a", "regex": "a"}},
     "prompts[1] (id 'two'): expected: give exactly one of exact or regex", "prompts.1.expected"),
    ({"id": "none", "prompt": "x", "expected": {}}, "prompts[1] (id 'none'): expected: give exactly one of exact or regex",
     "prompts.1.expected"),
    ({"id": "regex", "prompt": "x", "expected": {"regex": "(unclosed"}},
     "prompts[1] (id 'regex'): expected.regex: does not compile", "prompts.1.expected.regex"),
    ({"id": "hello", "prompt": "x"}, "prompts[1] (id 'hello'): id: duplicates prompts[0]", "prompts.1.id"),
    ("just text", "prompts[1]: must be a mapping", "prompts.1"),
]


@pytest.mark.parametrize("bad, message, field", BAD_PROMPTS, ids=[m.split(":")[0] + " " + m.split(": ", 1)[1][:30]
                                                                  for _, m, _ in BAD_PROMPTS])
def test_a_bad_prompt_is_refused_naming_the_entry_and_field(tmp_path: Path, bad: Any, message: str, field: str) -> None:
    error = refusal(tmp_path, {**HEADER, "prompts": [CHAT, bad]})
    assert str(error).startswith(f"golden set mini.yaml: {message}"), str(error)
    assert error.field == field and isinstance(error, ValidationFailed) and error.status == 422


@pytest.mark.parametrize("document, message", [
    ("", "the file is empty"),
    ("   \n", "the file is empty"),
    ("- a\n- b\n", "expected a mapping"),
    ("name: [unclosed\n", "invalid YAML"),
    (HEADER, "prompts: the set has no prompts"),
    ({**HEADER, "prompts": []}, "prompts: the set has no prompts"),
    ({**HEADER, "prompts": {"a": 1}}, "prompts: must be a list"),
    ({"name": "mini", "version": 1, "prompts": [CHAT]}, "model: required"),
    ({**HEADER, "version": 0, "prompts": [CHAT]}, "version: Input should be greater than or equal to 1"),
    ({**HEADER, "owner": "me", "prompts": [CHAT]}, "owner: unknown field"),
    ({**HEADER, "tolerance": {"max_distance": -1}, "prompts": [CHAT]}, "tolerance.max_distance: Input should be greater"),
])
def test_a_bad_file_is_refused_in_one_line(tmp_path: Path, document: Any, message: str) -> None:
    assert message in str(refusal(tmp_path, document))


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GoldenSetError, match="golden set missing.yaml: cannot be read"):
        load_golden(tmp_path / "missing.yaml")


def test_parse_golden_names_the_given_source() -> None:
    with pytest.raises(GoldenSetError, match=r"^golden set upload: prompts\[0\] \(id 'x'\): needs messages"):
        parse_golden({**HEADER, "prompts": [{"id": "x"}]}, source="upload")


# --- against the class ---

def golden(**header: Any) -> Any:
    return parse_golden({**HEADER, **header, "prompts": [CHAT, COMPLETION]}, source="mini.yaml")


def test_a_set_for_another_model_is_refused_naming_both() -> None:
    spec = ReplicaClassSpec(model="smollm2-135m", weights="smollm2")
    with pytest.raises(GoldenSetError, match="model: the set is for 'tiny', the class serves 'smollm2-135m'"):
        check_against_class(golden(), spec, spec.model, {"hello": 5, "river": 3})


def test_a_prompt_longer_than_the_window_is_refused_naming_the_entry() -> None:
    spec = ReplicaClassSpec(model="tiny", weights="tiny", max_model_len=64)
    check_against_class(golden(), spec, "tiny", {"hello": 48, "river": 56})  # 48 + 16 and 56 + 8: exactly fit
    with pytest.raises(GoldenSetError) as caught:
        check_against_class(golden(), spec, "tiny", {"hello": 48, "river": 57}, source="mini.yaml")
    assert str(caught.value) == ("golden set mini.yaml: prompts[1] (id 'river'): 57 prompt tokens + max_tokens 8 = 65 "
                                 "exceed the class's context window of 64")
    assert caught.value.field == "prompts.1"
    with pytest.raises(GoldenSetError, match=r"prompts\[0\] \(id 'hello'\): its prompt tokens were not counted"):
        check_against_class(golden(), spec, "tiny", {"river": 3})


def test_the_digest_follows_the_content() -> None:
    assert golden_digest(golden()) == golden_digest(golden())
    assert golden_digest(golden()) != golden_digest(golden(description="changed"))
    assert len(golden_digest(golden())) == 64
