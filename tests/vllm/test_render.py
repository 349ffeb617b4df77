"""The vLLM adapter's rendering. There is no GPU here: nothing starts vLLM; the command line is the contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.vllm import VllmRenderError, render_vllm_command
from fleetctl.replica_class import ReplicaClassSpec


def spec(**fields) -> dict:
    base = {"model": "qwen3-0.6b", "backend": "vllm", "weights": "Qwen/Qwen3-0.6B"}
    return ReplicaClassSpec(**{**base, **fields}).model_dump(mode="json")


def render(class_spec: dict, role: str = "mixed", **kwargs):
    args = {"role": role, "port": 8100, "served_model_name": "qwen3-0.6b", "hash_seed": "0",
            "kv_events_port": 8101, "replay_port": 8102}
    return render_vllm_command(class_spec, **{**args, **kwargs})


def flag(argv: list[str], name: str) -> str:
    """The value after `name`; fails the test when the flag is absent."""
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def test_mixed_engine_command_line_maps_every_field():
    launch = render(spec(max_model_len=4096, dtype="bfloat16", block_size=32, max_num_seqs=128,
                         max_num_batched_tokens=8192, gpu_memory_utilization=0.85, tensor_parallel_size=2))
    argv = launch.argv
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"]
    assert flag(argv, "--served-model-name") == "qwen3-0.6b"
    assert flag(argv, "--port") == "8100"
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert flag(argv, "--pipeline-parallel-size") == "1"
    assert flag(argv, "--data-parallel-size") == "1"
    assert flag(argv, "--max-model-len") == "4096"
    assert flag(argv, "--gpu-memory-utilization") == "0.85"
    assert flag(argv, "--dtype") == "bfloat16"
    assert flag(argv, "--kv-cache-dtype") == "auto"
    assert flag(argv, "--block-size") == "32"
    assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv
    assert flag(argv, "--prefix-caching-hash-algo") == "sha256_cbor"
    assert flag(argv, "--max-num-seqs") == "128"
    assert flag(argv, "--max-num-batched-tokens") == "8192"
    assert "--kv-transfer-config" not in argv  # a mixed engine does no P/D handoff
    assert "--revision" not in argv and "--host" not in argv and "--hf-overrides" not in argv


def test_kv_events_config_binds_both_ports_with_the_fleet_topic():
    argv = render(spec()).argv
    assert json.loads(flag(argv, "--kv-events-config")) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:8101",
        "replay_endpoint": "tcp://*:8102",
        "topic": "kv-events",
    }


def test_env_carries_the_hash_seed_and_int_block_hashes():
    launch = render(spec(), hash_seed="1234")
    assert launch.env == {"PYTHONHASHSEED": "1234", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1"}


def test_switches_render_their_negative_form():
    argv = render(spec(enable_prefix_caching=False, enable_chunked_prefill=False)).argv
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert "--no-enable-chunked-prefill" in argv and "--enable-chunked-prefill" not in argv
    # the hash algorithm is pinned either way, so turning caching back on cannot change hashes
    assert flag(argv, "--prefix-caching-hash-algo") == "sha256_cbor"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_pd_roles_get_the_nixl_connector_and_a_side_channel_port(role):
    launch = render(spec(), role=role, side_channel_port=8103)
    assert json.loads(flag(launch.argv, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert launch.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "8103"


def test_pd_role_without_side_channel_port_is_an_error():
    with pytest.raises(VllmRenderError) as err:
        render(spec(), role="prefill")
    assert err.value.field == "side_channel_port"


def test_api_key_goes_to_env_not_argv():
    launch = render(spec(), api_key="s3cret")
    assert launch.env["VLLM_API_KEY"] == "s3cret"
    assert "s3cret" not in " ".join(launch.argv) and "--api-key" not in launch.argv


def test_engine_args_render_as_flags_in_order():
    argv = render(spec(engine_args={"enforce-eager": True, "seed": 7, "enable_sleep_mode": True,
                                    "disable-log-stats": False, "swap-space": 4.5})).argv
    tail = argv[argv.index("--max-num-batched-tokens") + 2:]
    tail = tail[tail.index("--kv-events-config") + 2:]
    assert tail == ["--enforce-eager", "--seed", "7", "--enable-sleep-mode", "--no-disable-log-stats",
                    "--swap-space", "4.5"]


def test_engine_args_may_not_override_a_rendered_flag():
    with pytest.raises(VllmRenderError) as err:
        render(spec(engine_args={"max_model_len": 99}))
    assert err.value.field == "engine_args.max_model_len"


def test_revision_tokenizer_rope_scaling_and_host():
    argv = render(spec(weights_revision="abc123", tokenizer="Qwen/Qwen3-0.6B-tok", rope_scaling=4.0),
                  host="0.0.0.0").argv
    assert flag(argv, "--revision") == "abc123"
    assert flag(argv, "--tokenizer") == "Qwen/Qwen3-0.6B-tok"
    assert flag(argv, "--host") == "0.0.0.0"
    assert json.loads(flag(argv, "--hf-overrides")) == {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}


@pytest.mark.parametrize(("dtype", "kv_dtype", "expected"), [
    ("bfloat16", "auto", "auto"),
    ("float16", "float16", "auto"),
    ("bfloat16", "fp8", "fp8"),
    ("float16", "bfloat16", "bfloat16"),
])
def test_kv_cache_dtype_mapping(dtype, kv_dtype, expected):
    assert flag(render(spec(dtype=dtype, kv_cache_dtype=kv_dtype)).argv, "--kv-cache-dtype") == expected


def test_kv_cache_dtype_vllm_cannot_hold_is_an_error():
    with pytest.raises(VllmRenderError) as err:
        render(spec(dtype="bfloat16", kv_cache_dtype="float32"))
    assert err.value.field == "kv_cache_dtype"


def test_reference_only_sampler_is_an_error():
    with pytest.raises(VllmRenderError) as err:
        render(spec(sampler="approximate_topk"))
    assert err.value.field == "sampler"


def test_missing_field_is_named():
    class_spec = spec()
    del class_spec["max_model_len"]
    with pytest.raises(VllmRenderError) as err:
        render(class_spec)
    assert err.value.field == "max_model_len"


def test_unknown_role_is_an_error():
    with pytest.raises(VllmRenderError):
        render(spec(), role="both")


def test_adapter_does_not_import_the_control_plane():
    code = "import sys, engine.vllm; sys.exit(any(m == 'fleetctl' or m.startswith('fleetctl.') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_needs_vllm_rendered_command_parses_as_vllm_flags():
    """Would start `vllm serve` with this command line on a GPU node; here only the rendering is checked:
    every flag is a long option followed by at most one value, and JSON values parse."""
    argv = render(spec(engine_args={"enforce-eager": True}), role="decode", side_channel_port=8103).argv
    for i, token in enumerate(argv[3:], start=3):
        if token.startswith("--") and token.endswith("-config"):
            json.loads(argv[i + 1])
    assert all(not token.startswith("-") or token.startswith("--") for token in argv)


def test_vllms_default_seed_sets_no_pythonhashseed():
    """vLLM derives NONE_HASH from "vllm-none-hash" when PYTHONHASHSEED is unset (sha256_cbor): nothing to set."""
    launch = render(spec(), hash_seed="vllm-none-hash")
    assert "PYTHONHASHSEED" not in launch.env


@pytest.mark.parametrize("seed", ["abc", "-1", "4294967296", ""])
def test_a_seed_python_would_refuse_as_pythonhashseed_is_refused_naming_the_field(seed):
    with pytest.raises(VllmRenderError) as refused:
        render(spec(), hash_seed=seed)
    assert refused.value.field == "hash_seed" and "PYTHONHASHSEED" in str(refused.value)
