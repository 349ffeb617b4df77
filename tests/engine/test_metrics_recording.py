"""EngineMetrics as a step listener, fed synthetic StepResults: what each stat records, on no engine at all."""

from __future__ import annotations

import pytest

from engine import metric_names as m
from engine.contract.prometheus import parse_samples
from engine.reference.metrics import CacheInfo, EngineMetrics
from engine.contract.outputs import FinishedRequestStats, IterationStats, SchedulerStats, StepResult


def make_metrics() -> EngineMetrics:
    cache = CacheInfo(block_size=16, num_gpu_blocks=64, enable_prefix_caching=True, cache_dtype="auto",
                      max_model_len=256, kv_cache_mib=4)
    return EngineMetrics("model-a", 256, cache)


def sample(metrics: EngineMetrics, name: str, **labels: str) -> float:
    for s in parse_samples(metrics.exposition().decode()).get(name, ()):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(name)


def finished(reason: str = "length", prompt: int = 10, generated: int = 3) -> FinishedRequestStats:
    return FinishedRequestStats(reason, prompt, generated, max_tokens=3, n=1, num_preemptions=0, e2e_latency=0.5,
                                queue_time=0.01, prefill_time=0.1, decode_time=0.3, inference_time=0.4)


def test_a_request_over_three_steps() -> None:
    metrics = make_metrics()
    prefill = IterationStats(num_prompt_tokens=10, num_generation_tokens=1, prompt_lengths_first_token=[10],
                             time_to_first_tokens=[0.05], prefix_cache_queries=10, prefix_cache_hits=0)
    decode = IterationStats(num_generation_tokens=1, inter_token_latencies=[0.01])
    last = IterationStats(num_generation_tokens=1, inter_token_latencies=[0.01], finished=[finished()])
    for it in (prefill, decode, last):
        metrics.on_step(StepResult(iteration=it, scheduler=SchedulerStats(num_running=1, kv_cache_usage=0.25)))
    assert sample(metrics, "vllm:iteration_tokens_total_count") == 3
    assert sample(metrics, "vllm:iteration_tokens_total_sum") == 13
    assert sample(metrics, "vllm:time_to_first_token_seconds_count") == 1
    assert sample(metrics, "vllm:inter_token_latency_seconds_count") == 2
    assert sample(metrics, "vllm:prompt_tokens_total") == 10
    assert sample(metrics, "vllm:generation_tokens_total") == 3
    assert sample(metrics, "vllm:prefix_cache_queries_total") == 10
    assert sample(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert sample(metrics, "vllm:request_prompt_tokens_sum") == 10
    assert sample(metrics, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(0.5)
    assert sample(metrics, m.NUM_REQUESTS_RUNNING) == 1
    assert sample(metrics, m.KV_CACHE_USAGE_PERC) == 0.25


def test_prompt_sources_and_external_hits_of_a_pd_decode_request() -> None:
    """A decode engine's request: 64 prompt tokens, 48 sent by the prefill engine, 16 in its own cache."""
    metrics = make_metrics()
    first = IterationStats(num_prompt_tokens=0, num_generation_tokens=1, prompt_lengths_first_token=[64],
                           external_prefix_cache_queries=64, external_prefix_cache_hits=48,
                           prompt_tokens_local_compute=0, prompt_tokens_local_cache_hit=16, prompt_tokens_external=48)
    metrics.on_step(StepResult(iteration=first))
    done = FinishedRequestStats("length", 64, 5, max_tokens=5, n=1, num_preemptions=0, e2e_latency=1.0,
                                queue_time=0.0, prefill_time=0.2, decode_time=0.4, inference_time=0.6,
                                num_cached_tokens=64)
    metrics.on_step(StepResult(iteration=IterationStats(num_generation_tokens=1, finished=[done])))
    assert sample(metrics, "vllm:external_prefix_cache_queries_total") == 64
    assert sample(metrics, "vllm:external_prefix_cache_hits_total") == 48
    assert sample(metrics, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 48
    assert sample(metrics, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 16
    assert sample(metrics, "vllm:prompt_tokens_cached_total") == 64
    assert sample(metrics, "vllm:request_prefill_kv_computed_tokens_sum") == 0
    assert sample(metrics, "vllm:request_max_num_generation_tokens_sum") == 5
    assert sample(metrics, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(0.1)  # 0.4 s / 4


def test_a_notice_after_a_command_moves_gauges_but_observes_no_iteration() -> None:
    metrics = make_metrics()
    metrics.on_step(StepResult(scheduler=SchedulerStats(num_running=2, num_waiting=3, kv_cache_usage=0.5)))
    metrics.on_step(StepResult(scheduler=SchedulerStats(), is_step=False))  # e.g. after aborts
    assert sample(metrics, m.NUM_REQUESTS_RUNNING) == 0
    assert sample(metrics, m.NUM_REQUESTS_WAITING) == 0
    assert sample(metrics, m.NUM_REQUESTS_WAITING_BY_REASON, reason="capacity") == 0
    assert sample(metrics, m.KV_CACHE_USAGE_PERC) == 0
    assert sample(metrics, "vllm:iteration_tokens_total_count") == 0


def test_waiting_by_reason_sums_to_waiting() -> None:
    metrics = make_metrics()
    metrics.record_scheduler(SchedulerStats(num_waiting=4))
    total = sum(sample(metrics, m.NUM_REQUESTS_WAITING_BY_REASON, reason=r) for r in ("capacity", "deferred"))
    assert total == sample(metrics, m.NUM_REQUESTS_WAITING) == 4


def test_finish_reasons_are_counted_apart() -> None:
    metrics = make_metrics()
    done = [finished("stop"), finished("stop"), finished("abort")]
    metrics.on_step(StepResult(iteration=IterationStats(finished=done)))
    assert sample(metrics, "vllm:request_success_total", finished_reason="stop") == 2
    assert sample(metrics, "vllm:request_success_total", finished_reason="abort") == 1
    assert sample(metrics, "vllm:request_success_total", finished_reason="length") == 0


def test_kv_transfer_handoffs_and_failures() -> None:
    metrics = make_metrics()
    metrics.record_kv_transfer("pull", 4096, 0.02)
    metrics.record_kv_transfer("push", 1024, 0.001)
    metrics.record_kv_transfer_failure("checksum")
    assert sample(metrics, "fleet_kv_transfer_bytes_sum", mode="pull") == 4096
    assert sample(metrics, "fleet_kv_transfer_seconds_count", mode="push") == 1
    assert sample(metrics, "fleet_kv_transfer_failures_total", reason="checksum") == 1


def test_each_engine_has_its_own_registry() -> None:
    first, second = make_metrics(), make_metrics()
    first.record_kv_transfer_failure("timeout")
    with pytest.raises(KeyError):
        sample(second, "fleet_kv_transfer_failures_total", reason="timeout")
