"""What the agent reports of an engine's config: vLLM's answers read into a ReportedConfig (a fake vLLM
exposition: no GPU here), and the launch report (bounded, redacted, only what the agent set)."""

from __future__ import annotations

from agent.engine_config import launched_command
from engine.contract.reported import cache_config_labels, vllm_reported
from agent.process import agent_set_env
from engine.contract.launched import ARGV_MAX, REDACTED

# /metrics of vLLM with two DP ranks (labels as CacheConfig.metrics_info() prints them), shortened.
FAKE_VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="fp8",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",kv_cache_max_concurrency="12.5",kv_cache_size_tokens="25600",model_name="qwen",num_gpu_blocks="1600",prefix_caching_hash_algo="sha256_cbor"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="fp8",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",kv_cache_max_concurrency="12.5",kv_cache_size_tokens="25600",model_name="qwen",num_gpu_blocks="1600",prefix_caching_hash_algo="sha256_cbor"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 0.0
"""
FAKE_VLLM_MODELS = {"object": "list", "data": [{"id": "qwen", "object": "model", "root": "Qwen/Qwen3-0.6B",
                                                "max_model_len": 4096, "owned_by": "vllm"}]}


def test_fake_vllm_answers_become_a_reported_config() -> None:
    reported = vllm_reported({"version": "0.11.0"}, FAKE_VLLM_METRICS, FAKE_VLLM_MODELS)
    assert reported.source == "vllm" and reported.version == "0.11.0"
    assert reported.settings["cache_dtype"] == "fp8" and reported.settings["block_size"] == "16"
    assert reported.settings["max_model_len"] == 4096 and reported.settings["root"] == "Qwen/Qwen3-0.6B"
    assert "engine" not in reported.settings and "model_name" not in reported.settings


def test_fake_vllm_parts_that_did_not_answer_are_left_out() -> None:
    reported = vllm_reported(None, "", None)
    assert (reported.version, reported.settings) == (None, {})
    assert cache_config_labels("not an exposition {") == {}


def test_a_launch_report_is_bounded_and_redacted() -> None:
    report = launched_command(["python"] + ["--x"] * (ARGV_MAX + 10), {"VLLM_API_KEY": "k", "PYTHONHASHSEED": "0"})
    assert len(report.argv) == ARGV_MAX and report.argv[-1] == "... (12 more arguments)"
    assert report.env == {"VLLM_API_KEY": REDACTED, "PYTHONHASHSEED": "0"}


def test_the_reported_env_is_only_what_the_agent_sets(monkeypatch) -> None:
    monkeypatch.setenv("SOME_AGENT_VARIABLE", "x")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = agent_set_env({"PYTHONHASHSEED": "0"})
    assert set(env) == {"PYTHONHASHSEED", "PYTHONPATH"}
