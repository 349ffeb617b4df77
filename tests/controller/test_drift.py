"""`config_drift`: each class field read back from the engine's own report and from its command line, per
backend; engine_args and flags nobody declared; "auto" dtypes compared in the form the backend runs them.

Command lines are the ones the agent renders (agent.launch.render_launch), so "no drift" is checked against
the real renderer, not a copy of it."""

from __future__ import annotations

from typing import Any

import pytest

from agent.launch import PortBlock, render_launch
from engine.contract import EngineAssignment, LaunchedCommand, ReportedConfig
from fleetctl.controller.drift import Drift, config_drift, parse_argv
from fleetctl.replica_class import ReplicaClassSpec

PORTS = PortBlock(http=8100, kv_events=8101, replay=8102, side_channel=8103)
REFERENCE = {"model": "tiny", "weights": "tiny", "dtype": "float32", "kv_cache_dtype": "float32"}
VLLM = {"model": "qwen", "backend": "vllm", "weights": "Qwen/Qwen3-0.6B", "dtype": "bfloat16",
        "kv_cache_dtype": "bfloat16"}


def spec(base: dict[str, Any], **fields: Any) -> ReplicaClassSpec:
    return ReplicaClassSpec(**{**base, **fields})


def rendered(s: ReplicaClassSpec) -> LaunchedCommand:
    """The command line the agent launches for this class."""
    assignment = EngineAssignment(name="e-0", model=s.model, class_ref="c@r1", spec=s.model_dump(mode="json"))
    launch = render_launch(assignment, PORTS, hash_seed="0", python="python", vllm_executable="vllm")
    return LaunchedCommand(argv=launch.argv, env=launch.env)


def reference_report(s: ReplicaClassSpec, **settings: Any) -> ReportedConfig:
    """What a reference engine started for `s` reports (engine.reference.config_report), with `settings` changed."""
    dtype = "float32" if s.dtype == "auto" else s.dtype
    base = {"model": s.weights, "served_model_name": s.model, "dtype": dtype,
            "kv_cache_dtype": dtype if s.kv_cache_dtype == "auto" else s.kv_cache_dtype, "rope_scaling": s.rope_scaling, "sampler": s.sampler,
            "max_model_len": s.max_model_len, "seed": 0, "kv_cache_mib": s.kv_cache_mib, "block_size": s.block_size,
            "enable_prefix_caching": s.enable_prefix_caching, "enable_chunked_prefill": s.enable_chunked_prefill,
            "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens, "role": "mixed",
            "num_blocks": 64}
    return ReportedConfig(source="reference", version="0.1.0", settings={**base, **settings})


def vllm_report(**settings: Any) -> ReportedConfig:
    """vLLM's cache_config_info labels (strings) and /v1/models card for a VLLM-class engine."""
    base = {"block_size": "16", "cache_dtype": "auto", "enable_prefix_caching": "True",
            "gpu_memory_utilization": "0.9", "num_gpu_blocks": "1000", "max_model_len": 2048,
            "root": "Qwen/Qwen3-0.6B"}
    return ReportedConfig(source="vllm", version="0.11.0", settings={**base, **settings})


def with_flag(launched: LaunchedCommand, *args: str) -> LaunchedCommand:
    """The command line with `args` appended (a later flag wins, as argparse reads it)."""
    return LaunchedCommand(argv=[*launched.argv, *args], env=launched.env)


# --- nothing differs ---

@pytest.mark.parametrize("fields", [{}, {"dtype": "auto", "kv_cache_dtype": "auto"}, {"kv_cache_dtype": "auto"},
                                    {"enable_prefix_caching": False, "rope_scaling": 2.0, "engine_args": {"seed": 3}}])
def test_a_reference_engine_started_for_its_class_does_not_drift(fields: dict[str, Any]) -> None:
    s = spec(REFERENCE, **fields)
    assert config_drift(s, rendered(s), reference_report(s)) == []


@pytest.mark.parametrize("fields", [{}, {"kv_cache_dtype": "auto"}, {"kv_cache_dtype": "fp8"},
                                    {"weights_revision": "abc123", "engine_args": {"enforce-eager": True}}])
def test_a_vllm_engine_started_for_its_class_does_not_drift(fields: dict[str, Any]) -> None:
    s = spec(VLLM, **fields)
    report = vllm_report(cache_dtype="fp8") if s.kv_cache_dtype == "fp8" else vllm_report()
    assert config_drift(s, rendered(s), report) == []


def test_nothing_known_is_no_drift_to_report() -> None:
    assert config_drift(spec(REFERENCE), None, None) == []
    assert config_drift(spec(REFERENCE), LaunchedCommand(argv=[]), None) == []


# --- the engine's own report, field by field ---

REFERENCE_ENGINE_FIELDS = [
    ("weights", "model", "smollm2", "tiny", "smollm2"),
    ("model", "served_model_name", "other", "tiny", "other"),
    ("dtype", "dtype", "bfloat16", "float32", "bfloat16"),
    ("kv_cache_dtype", "kv_cache_dtype", "bfloat16", "float32", "bfloat16"),
    ("max_model_len", "max_model_len", 4096, 2048, 4096),
    ("rope_scaling", "rope_scaling", 4.0, None, 4.0),
    ("sampler", "sampler", "approximate_topk", "exact", "approximate_topk"),
    ("block_size", "block_size", 32, 16, 32),
    ("max_num_seqs", "max_num_seqs", 8, 64, 8),
    ("max_num_batched_tokens", "max_num_batched_tokens", 1024, 512, 1024),
    ("kv_cache_mib", "kv_cache_mib", 32, 256, 32),
    ("enable_prefix_caching", "enable_prefix_caching", False, True, False),
    ("enable_chunked_prefill", "enable_chunked_prefill", False, True, False),
]


@pytest.mark.parametrize(("field", "key", "value", "declared", "actual"), REFERENCE_ENGINE_FIELDS)
def test_each_field_the_reference_engine_reports(field: str, key: str, value: Any, declared: Any, actual: Any) -> None:
    s = spec(REFERENCE)
    assert config_drift(s, None, reference_report(s, **{key: value})) == [Drift(field, declared, actual, "engine")]


VLLM_ENGINE_FIELDS = [
    ("weights", "root", "other/model", "Qwen/Qwen3-0.6B", "other/model"),
    ("kv_cache_dtype", "cache_dtype", "fp8", "auto", "fp8"),
    ("block_size", "block_size", "32", 16, 32),
    ("enable_prefix_caching", "enable_prefix_caching", "False", True, False),
    ("gpu_memory_utilization", "gpu_memory_utilization", "0.5", 0.9, 0.5),
    ("max_model_len", "max_model_len", 4096, 2048, 4096),
]


@pytest.mark.parametrize(("field", "key", "value", "declared", "actual"), VLLM_ENGINE_FIELDS)
def test_each_field_vllm_reports_fake_vllm(field: str, key: str, value: Any, declared: Any, actual: Any) -> None:
    assert config_drift(spec(VLLM), None, vllm_report(**{key: value})) == [Drift(field, declared, actual, "engine")]


def test_a_report_of_another_backend_is_not_read_as_this_one() -> None:
    assert config_drift(spec(VLLM), None, reference_report(spec(REFERENCE), kv_cache_dtype="bfloat16")) == []


# --- the command line, field by field ---

REFERENCE_LAUNCH_FIELDS = [
    ("weights", ("--model", "smollm2"), "tiny", "smollm2"),
    ("model", ("--served-model-name", "x"), "tiny", "x"),
    ("dtype", ("--dtype", "float16"), "float32", "float16"),
    ("kv_cache_dtype", ("--kv-cache-dtype", "bfloat16"), "float32", "bfloat16"),
    ("max_model_len", ("--max-model-len", "1024"), 2048, 1024),
    ("block_size", ("--block-size=8",), 16, 8),
    ("max_num_seqs", ("--max-num-seqs", "2"), 64, 2),
    ("max_num_batched_tokens", ("--max-num-batched-tokens", "64"), 512, 64),
    ("kv_cache_mib", ("--kv-cache-mib", "16"), 256, 16),
    ("rope_scaling", ("--rope-scaling", "2.0"), None, 2.0),
    ("sampler", ("--sampler", "approximate_topk"), "exact", "approximate_topk"),
    ("enable_prefix_caching", ("--no-enable-prefix-caching",), True, False),
    ("enable_chunked_prefill", ("--no-enable-chunked-prefill",), True, False),
]


@pytest.mark.parametrize(("field", "args", "declared", "actual"), REFERENCE_LAUNCH_FIELDS)
def test_each_flag_of_a_reference_launch(field: str, args: tuple[str, ...], declared: Any, actual: Any) -> None:
    s = spec(REFERENCE)
    assert config_drift(s, with_flag(rendered(s), *args), None) == [Drift(field, declared, actual, "launch")]


VLLM_LAUNCH_FIELDS = [
    ("weights_revision", ("--revision", "v2"), "main", "v2"),
    ("tokenizer", ("--tokenizer", "t"), None, "t"),
    ("kv_cache_dtype", ("--kv-cache-dtype", "fp8"), "auto", "fp8"),
    ("max_model_len", ("--max-model-len", "8192"), 2048, 8192),
    ("tensor_parallel_size", ("--tensor-parallel-size", "2"), 1, 2),
    ("data_parallel_size", ("--data-parallel-size", "2"), 1, 2),
    ("gpu_memory_utilization", ("--gpu-memory-utilization", "0.8"), 0.9, 0.8),
    ("max_num_seqs", ("--max-num-seqs", "16"), 64, 16),
]


@pytest.mark.parametrize(("field", "args", "declared", "actual"), VLLM_LAUNCH_FIELDS)
def test_each_flag_of_a_vllm_launch_fake_vllm(field: str, args: tuple[str, ...], declared: Any, actual: Any) -> None:
    s = spec(VLLM)
    assert config_drift(s, with_flag(rendered(s), *args), None) == [Drift(field, declared, actual, "launch")]


def test_vllm_weights_are_its_positional_model() -> None:
    s = spec(VLLM)
    argv = rendered(s).argv
    swapped = LaunchedCommand(argv=[argv[0], argv[1], "other/model", *argv[3:]])
    assert config_drift(s, swapped, None) == [Drift("weights", "Qwen/Qwen3-0.6B", "other/model", "launch")]


def test_an_equal_kv_dtype_launched_as_auto_is_no_drift_on_vllm() -> None:
    s = spec(VLLM)  # kv bfloat16 == dtype bfloat16: launched as "auto", and vLLM reports "auto"
    assert "auto" in rendered(s).argv
    assert config_drift(s, with_flag(rendered(s), "--kv-cache-dtype", "bfloat16"), None) == []


# --- engine_args and flags nobody declared ---

def test_engine_args_must_be_on_the_command_line_with_their_values() -> None:
    s = spec(REFERENCE, engine_args={"seed": 3, "num_threads": 1})
    launched = rendered(s)
    missing = LaunchedCommand(argv=[a for a in launched.argv if a not in ("--num-threads", "1")])
    assert config_drift(s, missing, None) == [Drift("engine_args.num_threads", 1, None, "launch")]
    changed = with_flag(launched, "--seed", "4")
    assert config_drift(s, changed, None) == [Drift("engine_args.seed", 3, "4", "launch")]


def test_a_switch_in_engine_args_is_read_as_a_switch() -> None:
    s = spec(VLLM, engine_args={"enforce-eager": True})
    flipped = with_flag(rendered(s), "--no-enforce-eager")
    assert config_drift(s, flipped, None) == [Drift("engine_args.enforce-eager", True, False, "launch")]


def test_a_flag_no_class_field_rendered_is_a_difference() -> None:
    s = spec(VLLM)
    extra = with_flag(rendered(s), "--quantization", "awq", "--enforce-eager")
    assert config_drift(s, extra, None) == [Drift("argv.--quantization", None, "awq", "launch"),
                                            Drift("argv.--enforce-eager", None, True, "launch")]


# --- both sources, and the version ---

def test_both_sources_name_the_same_field_engine_first() -> None:
    s = spec(REFERENCE)
    drifts = config_drift(s, with_flag(rendered(s), "--kv-cache-dtype", "bfloat16"),
                          reference_report(s, kv_cache_dtype="bfloat16"))
    assert drifts == [Drift("kv_cache_dtype", "float32", "bfloat16", "engine"),
                      Drift("kv_cache_dtype", "float32", "bfloat16", "launch")]


def test_a_declared_engine_version_is_compared_with_the_reported_one() -> None:
    class Versioned(ReplicaClassSpec):
        engine_version: str | None = None

    s = Versioned(**REFERENCE, engine_version="0.2.0")
    assert config_drift(s, None, reference_report(spec(REFERENCE))) == [Drift("engine_version", "0.2.0", "0.1.0", "engine")]
    assert config_drift(Versioned(**REFERENCE), None, reference_report(spec(REFERENCE))) == []


def test_parse_argv_reads_values_switches_and_the_last_occurrence() -> None:
    parsed = parse_argv(["vllm", "serve", "m", "--a", "1", "--b", "--no-c", "--d=x", "--a", "2", "--e", "-1"])
    assert parsed.positional == ("vllm", "serve", "m")
    assert dict(parsed.flags) == {"a": "2", "b": True, "c": False, "d": "x", "e": "-1"}
