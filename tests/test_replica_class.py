"""Replica class tags: every field has the tag it should, engine_args is tagged per flag, and the diff, the
traffic-split guard and the digest agree with them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from fleetctl.controller.traffic_guard import CORRECTNESS_SPLIT_REFUSED, check_split
from fleetctl.replica_class import (
    CORRECTNESS,
    PERFORMANCE,
    PERFORMANCE_ONLY_ENGINE_ARGS,
    ReplicaClassSpec,
    correctness_differences,
    correctness_values,
    diff,
    engine_arg_tag,
    field_tags,
)

BASE = {"model": "chat-model", "weights": "smollm2"}

# Every field of ReplicaClassSpec, its tag, and a value that differs from BASE's. A new field fails
# test_every_field_has_its_expected_tag until it is added here with the tag it should have.
EXPECTED: dict[str, tuple[str, Any]] = {
    "model": (CORRECTNESS, "other-model"),
    "backend": (CORRECTNESS, "vllm"),
    "weights": (CORRECTNESS, "tiny"),
    "weights_revision": (CORRECTNESS, "v2"),
    "tokenizer": (CORRECTNESS, "other/tokenizer"),
    "dtype": (CORRECTNESS, "bfloat16"),
    "kv_cache_dtype": (CORRECTNESS, "bfloat16"),
    "max_model_len": (CORRECTNESS, 8192),
    "rope_scaling": (CORRECTNESS, 2.0),
    "sampler": (CORRECTNESS, "approximate_topk"),
    "engine_version": (CORRECTNESS, "0.2.0"),
    "engine_args": (CORRECTNESS, {"quantization": "awq"}),  # per flag; an unknown flag is correctness
    "block_size": (PERFORMANCE, 32),
    "enable_prefix_caching": (PERFORMANCE, False),
    "enable_chunked_prefill": (PERFORMANCE, False),
    "max_num_seqs": (PERFORMANCE, 128),
    "max_num_batched_tokens": (PERFORMANCE, 1024),
    "kv_cache_mib": (PERFORMANCE, 512),
    "gpu_memory_utilization": (PERFORMANCE, 0.5),
    "tensor_parallel_size": (PERFORMANCE, 2),
    "pipeline_parallel_size": (PERFORMANCE, 2),
    "data_parallel_size": (PERFORMANCE, 2),
    "kv_tiers": (PERFORMANCE, {"dram_mib": 512, "disk_mib": 4096}),
}


def changed(field: str, value: Any) -> ReplicaClassSpec:
    spec = {**BASE, field: value}
    if field == "backend":
        spec["weights"] = "Qwen/Qwen3-0.6B"  # the reference backend serves only its own models
    return ReplicaClassSpec(**spec)


def test_every_field_has_its_expected_tag() -> None:
    assert field_tags() == {name: tag for name, (tag, _) in EXPECTED.items()}
    assert all(info.description for info in ReplicaClassSpec.model_fields.values())


@pytest.mark.parametrize("field", sorted(EXPECTED))
def test_changing_one_field_is_reported_with_its_tag(field: str) -> None:
    tag, value = EXPECTED[field]
    changes = diff(ReplicaClassSpec(**BASE), changed(field, value))
    if field == "backend":  # changing the backend needs other weights too
        changes = [c for c in changes if c["field"] != "weights"]
    name = "engine_args.quantization" if field == "engine_args" else field
    assert [(c["field"], c["tag"]) for c in changes] == [(name, tag)]
    assert (name in correctness_differences(ReplicaClassSpec(**BASE), changed(field, value))) == (tag == CORRECTNESS)


def test_engine_args_are_tagged_per_flag() -> None:
    old = ReplicaClassSpec(**BASE, engine_args={"enforce-eager": False, "seed": 1, "quantization": "awq"})
    new = ReplicaClassSpec(**BASE, engine_args={"enforce_eager": True, "seed": 1, "--my-new-flag": 3,
                                                "debug-step-delay-ms": 50})
    assert diff(old, new) == [
        {"field": "engine_args.my-new-flag", "tag": CORRECTNESS, "old": None, "new": 3},  # unknown: correctness
        {"field": "engine_args.quantization", "tag": CORRECTNESS, "old": "awq", "new": None},
        {"field": "engine_args.debug-step-delay-ms", "tag": PERFORMANCE, "old": None, "new": 50},
        {"field": "engine_args.enforce-eager", "tag": PERFORMANCE, "old": False, "new": True},
    ]
    assert correctness_differences(old, new) == ["engine_args.my-new-flag", "engine_args.quantization"]


def test_engine_args_spellings_are_one_flag_but_values_keep_their_type() -> None:
    dashed = ReplicaClassSpec(**BASE, engine_args={"max-num-partial-prefills": 2, "seed": 1})
    assert diff(dashed, ReplicaClassSpec(**BASE, engine_args={"max_num_partial_prefills": 2, "--seed": 1})) == []
    # `--seed 1` and `--seed` (True) are different command lines, though True == 1 in Python
    assert correctness_differences(dashed, ReplicaClassSpec(**BASE, engine_args={"max-num-partial-prefills": 2,
                                                                                 "seed": True})) == ["engine_args.seed"]


@pytest.mark.parametrize("flag", ["enforce-eager", "max-num-partial-prefills", "disable-log-requests", "swap-space",
                                  "num-scheduler-steps", "debug-step-delay-ms"])
def test_the_documented_performance_only_flags(flag: str) -> None:
    assert engine_arg_tag(flag) == PERFORMANCE and engine_arg_tag(flag.replace("-", "_")) == PERFORMANCE


def test_every_performance_only_flag_says_why_and_is_spelled_as_rendered() -> None:
    for flag, why in PERFORMANCE_ONLY_ENGINE_ARGS.items():
        assert why.strip() and flag == flag.lower().lstrip("-").replace("_", "-"), flag
    for flag in ("quantization", "seed", "num-threads", "speculative-config", "anything-else"):
        assert engine_arg_tag(flag) == CORRECTNESS


def test_the_split_guard_uses_the_per_flag_tags() -> None:
    specs = {"chat@r1": ReplicaClassSpec(**BASE),
             "chat@r2": ReplicaClassSpec(**BASE, engine_args={"enforce-eager": True, "swap-space": 4}),
             "chat@r3": ReplicaClassSpec(**BASE, engine_args={"quantization": "fp8"})}
    ready = dict.fromkeys(specs, 1)
    assert check_split("chat-model", {"chat@r1": 1, "chat@r2": 1}, specs, ready, False) == []
    (refusal,) = check_split("chat-model", {"chat@r1": 1, "chat@r3": 1}, specs, ready, False)
    assert refusal.code == CORRECTNESS_SPLIT_REFUSED
    assert "differ in correctness fields: engine_args.quantization none -> fp8" in refusal.message


def test_correctness_values_show_only_correctness_relevant_flags() -> None:
    spec = ReplicaClassSpec(**BASE, engine_version="0.1.0", engine_args={"enforce-eager": True, "quantization": "awq"})
    values = correctness_values(spec)
    assert values["engine_args"] == {"quantization": "awq"} and values["engine_version"] == "0.1.0"
    assert "max_num_seqs" not in values


def test_unset_engine_version_and_kv_tiers_keep_the_digest_of_content_from_before_the_fields() -> None:
    spec = ReplicaClassSpec(**BASE)
    before = {k: v for k, v in spec.model_dump(mode="json").items() if k not in ("engine_version", "kv_tiers")}
    canonical = json.dumps(before, sort_keys=True, separators=(",", ":"))
    assert spec.digest() == hashlib.sha256(canonical.encode()).hexdigest()
    assert ReplicaClassSpec(**BASE, engine_version="0.1.0").digest() != spec.digest()
    assert ReplicaClassSpec(**BASE, kv_tiers={"dram_mib": 64}).digest() != spec.digest()


def test_a_blank_engine_version_is_refused() -> None:
    with pytest.raises(ValueError, match="engine_version"):
        ReplicaClassSpec(**BASE, engine_version="  ")
