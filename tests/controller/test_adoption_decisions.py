"""adoption's pure decisions: which engines are refused and why, the state a probe leaves, when a released one
goes, and the default name."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from engine.contract import ReportedConfig
from fleetctl.controller.adoption import (
    DRAINING, READY, RELEASE_GRACE_S, UNREACHABLE, EngineProbe, default_name, next_state, refusal, releasable,
)
from fleetctl.replica_class import ReplicaClassSpec

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
VLLM = ReplicaClassSpec(model="qwen", backend="vllm", weights="Qwen/Qwen3-0.6B", max_model_len=4096,
                        dtype="bfloat16", kv_cache_dtype="auto", block_size=16)


def vllm_probe(**settings: object) -> EngineProbe:
    reported = {"cache_dtype": "auto", "block_size": "16", "max_model_len": 4096, "root": "Qwen/Qwen3-0.6B",
                **settings}
    return EngineProbe(("qwen",), ReportedConfig(source="vllm", version="0.33.0", settings=reported),
                       {"num_requests_running": 0.0, "num_requests_waiting": 0.0})


def test_an_engine_that_matches_its_class_is_accepted_and_a_performance_difference_does_not_matter():
    assert refusal(VLLM, "qwen", vllm_probe()) is None
    assert refusal(VLLM, "qwen", vllm_probe(block_size="32", gpu_memory_utilization="0.8")) is None


def test_a_correctness_difference_is_refused_naming_the_field():
    field, why = refusal(VLLM, "qwen", vllm_probe(max_model_len=32768, root="Qwen/Qwen3-8B"))
    assert field == "weights" and "Qwen/Qwen3-8B" in why and "max_model_len" in why


def test_an_engine_that_does_not_serve_the_model_or_cannot_be_asked_is_refused():
    assert refusal(VLLM, "other", vllm_probe())[0] == "model"
    assert refusal(VLLM, "qwen", EngineProbe(error="cannot reach http://x:1"))[0] == "url"


def test_a_probe_moves_an_engine_between_ready_and_unreachable_but_never_out_of_draining():
    down = EngineProbe(error="cannot reach")
    assert next_state(READY, down) == UNREACHABLE and next_state(UNREACHABLE, vllm_probe()) == READY
    assert next_state(DRAINING, vllm_probe()) == DRAINING and next_state(DRAINING, down) == DRAINING


def test_a_released_engine_goes_after_the_grace_once_nothing_runs_on_it():
    since = NOW - timedelta(seconds=RELEASE_GRACE_S + 1)
    busy = EngineProbe(("qwen",), None, {"num_requests_running": 1.0, "num_requests_waiting": 0.0})
    assert releasable(DRAINING, since, vllm_probe(), NOW)
    assert not releasable(DRAINING, since, busy, NOW)  # in flight: wait
    assert not releasable(DRAINING, NOW - timedelta(seconds=1), vllm_probe(), NOW)  # gateways may still route
    assert releasable(DRAINING, since, EngineProbe(error="gone"), NOW)  # nothing of ours runs on a gone engine
    assert not releasable(READY, since, vllm_probe(), NOW)


def test_the_default_name_is_a_fleet_name_from_host_and_port():
    assert default_name("http://10.0.0.5:8100") == "adopted-10-0-0-5-8100"
    assert default_name("https://Engine.Example.com:443/") == "adopted-engine-example-com-443"
