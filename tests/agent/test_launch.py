"""From an assignment to the engine's command line: the reference engine's flags mirror EngineConfig."""

from __future__ import annotations

import pytest

from agent.launch import LaunchError, PortBlock, render_launch
from engine.contract import EngineAssignment
from fleetctl.replica_class import ReplicaClassSpec

PORTS = PortBlock(http=8100, kv_events=8101, replay=8102)


def assignment(role: str = "mixed", **spec_fields) -> EngineAssignment:
    spec = ReplicaClassSpec(**{"model": "smollm2-135m", "weights": "smollm2", **spec_fields})
    return EngineAssignment(name="chat-0", model="smollm2-135m", class_ref="chat@r1",
                            spec=spec.model_dump(mode="json"), role=role)


def test_reference_engine_command():
    launch = render_launch(assignment(role="decode", kv_cache_mib=64, block_size=16, max_model_len=1024,
                                      max_num_seqs=8, max_num_batched_tokens=256, rope_scaling=2.0),
                           PORTS, hash_seed="42", python="/py")
    assert launch.argv == [
        "/py", "-m", "engine.reference", "--model", "smollm2", "--served-model-name", "smollm2-135m",
        "--role", "decode", "--port", "8100", "--kv-cache-mib", "64", "--block-size", "16",
        "--max-model-len", "1024", "--max-num-seqs", "8", "--max-num-batched-tokens", "256",
        "--dtype", "float32", "--kv-cache-dtype", "auto", "--rope-scaling", "2.0", "--sampler", "exact",
        "--kv-events-endpoint", "tcp://127.0.0.1:8101", "--kv-events-replay-endpoint", "tcp://127.0.0.1:8102",
        "--engine-id", "chat-0", "--hash-seed", "42",
    ]
    assert launch.env == {}


def test_switches_and_engine_args():
    argv = render_launch(assignment(enable_prefix_caching=False, enable_chunked_prefill=False, dtype="bfloat16",
                                    engine_args={"drain-grace-s": 5}),
                         PORTS, hash_seed="0").argv
    assert "--no-enable-prefix-caching" in argv and "--no-enable-chunked-prefill" in argv
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[-2:] == ["--drain-grace-s", "5"]


def test_engine_args_may_not_repeat_a_rendered_flag():
    with pytest.raises(LaunchError, match="--port"):
        render_launch(assignment(engine_args={"port": 1}), PORTS, hash_seed="0")


def test_fp8_kv_is_not_a_reference_engine_dtype():
    with pytest.raises(LaunchError, match="kv_cache_dtype"):
        render_launch(assignment(kv_cache_dtype="fp8"), PORTS, hash_seed="0")


def test_vllm_backend_goes_through_the_adapter():
    a = EngineAssignment(name="q-0", model="qwen", class_ref="q@r1", role="prefill", spec=ReplicaClassSpec(
        model="qwen", backend="vllm", weights="Qwen/Qwen3-0.6B").model_dump(mode="json"))
    launch = render_launch(a, PortBlock(8100, 8101, 8102, 8103), hash_seed="7", vllm_executable="/opt/vllm")
    assert launch.argv[:3] == ["/opt/vllm", "serve", "Qwen/Qwen3-0.6B"]
    assert launch.env["PYTHONHASHSEED"] == "7" and launch.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "8103"


def test_vllm_render_errors_become_launch_errors():
    a = EngineAssignment(name="q-0", model="qwen", class_ref="q@r1", spec=ReplicaClassSpec(
        model="qwen", backend="vllm", weights="Qwen/Qwen3-0.6B", sampler="approximate_topk").model_dump(mode="json"))
    with pytest.raises(LaunchError, match="q@r1"):
        render_launch(a, PORTS, hash_seed="0")


def test_a_class_made_slow_through_engine_args_starts_a_slow_engine():
    from engine.reference.cli_args import build_parser, config_from_args

    argv = render_launch(assignment(engine_args={"debug-step-delay-ms": 40}), PORTS, hash_seed="0").argv
    assert argv[-2:] == ["--debug-step-delay-ms", "40"]
    assert config_from_args(build_parser().parse_args(argv[3:])).debug_step_delay_ms == 40
