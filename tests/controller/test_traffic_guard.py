"""The traffic-split guard as a pure function: table-driven cases, and the property that a split whose
positively weighted revisions share every correctness field is never refused for correctness."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.controller.traffic_guard import (
    CORRECTNESS_SPLIT_REFUSED,
    Refusal,
    check_split,
    correctness_differences,
)
from fleetctl.replica_class import ReplicaClassSpec

MODEL = "chat-model"
BASE = {"model": MODEL, "weights": "smollm2"}
SPECS = {
    "chat@r1": ReplicaClassSpec(**BASE),
    "chat@r2": ReplicaClassSpec(**BASE, max_model_len=8192, sampler="approximate_topk"),
    "chat@r3": ReplicaClassSpec(**BASE, max_num_seqs=8, kv_cache_mib=512),  # performance only vs r1
    "chat@r4": ReplicaClassSpec(**BASE, dtype="bfloat16"),
    "chat@r10": ReplicaClassSpec(**BASE, rope_scaling=2.0),
    "other@r1": ReplicaClassSpec(model="other-model", weights="smollm2"),
}
READY = {"chat@r1": 2, "chat@r2": 1, "chat@r3": 1, "chat@r4": 1, "chat@r10": 1, "other@r1": 1}


def refusals(weights: dict[str, float], ready: dict[str, int] | None = None, allow: bool = False) -> list[tuple[str, str | None, int]]:
    found = check_split(MODEL, weights, SPECS, READY if ready is None else ready, allow)
    return [(r.code, r.field, r.status) for r in found]


CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[tuple[str, str | None, int]]]] = [
    ("one revision at 100% is a cutover", {"chat@r1": 1}, {}, []),
    ("a cutover to a differing revision is fine", {"chat@r1": 0, "chat@r2": 100}, {}, []),
    ("performance-only differences split freely", {"chat@r1": 90, "chat@r3": 10}, {}, []),
    ("zero-weight revisions need no engine", {"chat@r1": 1, "chat@r2": 0}, {"ready": {"chat@r1": 1}}, []),
    ("negative weight", {"chat@r1": 1, "chat@r3": -1}, {}, [("invalid_weight", "weights.chat@r3", 422)]),
    ("not finite", {"chat@r1": float("inf")}, {}, [("invalid_weight", "weights.chat@r1", 422)]),
    ("not a number", {"chat@r1": float("nan")}, {}, [("invalid_weight", "weights.chat@r1", 422)]),
    ("no positive weight", {"chat@r1": 0, "chat@r3": 0}, {}, [("validation_failed", "weights", 422)]),
    ("nothing at all", {}, {}, [("validation_failed", "weights", 422)]),
    ("unknown revision", {"chat@r9": 1}, {}, [("unknown_class", "weights.chat@r9", 422)]),
    ("a class name, not a revision", {"chat": 1}, {}, [("validation_failed", "weights.chat", 422)]),
    ("another model's revision", {"other@r1": 1}, {}, [("validation_failed", "weights.other@r1", 422)]),
    ("invalid input is reported before the guard", {"chat@r2": 1, "chat@r1": 1, "ghost@r1": 0}, {},
     [("unknown_class", "weights.ghost@r1", 422)]),
    ("no ready engine", {"chat@r1": 1, "chat@r3": 1}, {"ready": {"chat@r1": 1}},
     [("no_ready_engines", "weights.chat@r3", 409)]),
    ("the only revision has no ready engine", {"chat@r1": 1}, {"ready": {}}, [("no_ready_engines", "weights.chat@r1", 409)]),
    ("correctness split", {"chat@r1": 90, "chat@r2": 10}, {}, [(CORRECTNESS_SPLIT_REFUSED, "weights.chat@r2", 409)]),
    ("every differing pair is named", {"chat@r1": 1, "chat@r3": 1, "chat@r4": 1}, {},
     [(CORRECTNESS_SPLIT_REFUSED, "weights.chat@r4", 409), (CORRECTNESS_SPLIT_REFUSED, "weights.chat@r4", 409)]),
    ("revision order is numeric", {"chat@r10": 1, "chat@r1": 1}, {}, [(CORRECTNESS_SPLIT_REFUSED, "weights.chat@r10", 409)]),
    ("allowed when asked", {"chat@r1": 90, "chat@r2": 10}, {"allow": True}, []),
    ("allowing does not waive ready engines", {"chat@r1": 1, "chat@r2": 1}, {"allow": True, "ready": {"chat@r1": 1}},
     [("no_ready_engines", "weights.chat@r2", 409)]),
    ("engines and correctness together", {"chat@r1": 1, "chat@r2": 1}, {"ready": {"chat@r1": 1}},
     [("no_ready_engines", "weights.chat@r2", 409), (CORRECTNESS_SPLIT_REFUSED, "weights.chat@r2", 409)]),
]


@pytest.mark.parametrize(("weights", "options", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_split(weights: dict[str, float], options: dict[str, Any], expected: list[tuple[str, str | None, int]]) -> None:
    assert refusals(weights, options.get("ready"), options.get("allow", False)) == expected


def test_the_correctness_refusal_lists_the_differing_fields_and_values() -> None:
    (refusal,) = check_split(MODEL, {"chat@r2": 10, "chat@r1": 90}, SPECS, READY, False)
    assert refusal == Refusal(
        CORRECTNESS_SPLIT_REFUSED,
        "chat@r1 and chat@r2 differ in correctness fields: max_model_len 2048 -> 8192, sampler exact -> approximate_topk; "
        "pass allow_correctness_change to split traffic anyway",
        "weights.chat@r2", 409,
    )
    (rope,) = check_split(MODEL, {"chat@r1": 1, "chat@r10": 1}, SPECS, READY, False)
    assert "rope_scaling none -> 2.0" in rope.message


def test_differences_are_reported_for_the_audit_even_when_allowed() -> None:
    (difference,) = correctness_differences({"chat@r1": 90, "chat@r2": 10, "chat@r3": 0}, SPECS)
    assert difference.to_json() == {"between": ["chat@r1", "chat@r2"], "fields": [
        {"field": "max_model_len", "first": 2048, "second": 8192},
        {"field": "sampler", "first": "exact", "second": "approximate_topk"},
    ]}


# --- property: same correctness fields => never a correctness refusal ---

correctness_values = st.fixed_dictionaries({
    "dtype": st.sampled_from(["float32", "bfloat16", "float16", "auto"]),
    "kv_cache_dtype": st.sampled_from(["auto", "float32", "fp8"]),
    "max_model_len": st.integers(1, 1_048_576),
    "rope_scaling": st.none() | st.floats(0.1, 8.0),
    "sampler": st.sampled_from(["exact", "approximate_topk"]),
    "weights_revision": st.sampled_from(["main", "v2"]),
})
performance_values = st.fixed_dictionaries({
    "max_num_seqs": st.integers(1, 1024),
    "block_size": st.sampled_from([8, 16, 32]),
    "kv_cache_mib": st.integers(1, 4096),
    "enable_prefix_caching": st.booleans(),
})


@settings(max_examples=200, deadline=None)
@given(shared=correctness_values, performance=st.lists(performance_values, min_size=1, max_size=6),
       weights=st.lists(st.floats(0, 1e6), min_size=1, max_size=6))
def test_a_split_over_identical_correctness_fields_is_never_refused_for_correctness(
    shared: dict[str, Any], performance: list[dict[str, Any]], weights: list[float],
) -> None:
    specs = {f"chat@r{i + 1}": ReplicaClassSpec(**BASE, **shared, **perf) for i, perf in enumerate(performance)}
    split = {ref: weights[i % len(weights)] for i, ref in enumerate(specs)}
    found = check_split(MODEL, split, specs, {ref: 1 for ref in specs}, allow_correctness_change=False)
    assert all(r.code != CORRECTNESS_SPLIT_REFUSED for r in found)
    assert correctness_differences(split, specs) == []


@settings(max_examples=100, deadline=None)
@given(a=correctness_values, b=correctness_values)
def test_a_split_over_differing_correctness_fields_is_refused_unless_allowed(a: dict[str, Any], b: dict[str, Any]) -> None:
    specs = {"chat@r1": ReplicaClassSpec(**BASE, **a), "chat@r2": ReplicaClassSpec(**BASE, **b)}
    split, ready = {"chat@r1": 1.0, "chat@r2": 1.0}, {"chat@r1": 1, "chat@r2": 1}
    refused = [r.code for r in check_split(MODEL, split, specs, ready, allow_correctness_change=False)]
    assert refused == ([CORRECTNESS_SPLIT_REFUSED] if a != b else [])
    assert check_split(MODEL, split, specs, ready, allow_correctness_change=True) == []
