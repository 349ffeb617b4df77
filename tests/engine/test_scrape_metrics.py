"""Reading the key load figures from a vLLM-style /metrics exposition."""

from __future__ import annotations

import pytest

from engine.contract.scrape import parse_engine_metrics
from engine.contract import EngineMetrics, EngineObserved

# As vLLM v1 exposes them (docs: reference/vllm-contracts.md), with two DP ranks for the summing rules.
SAMPLE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2-135m"} 3.0
vllm:num_requests_running{engine="1",model_name="smollm2-135m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="smollm2-135m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="smollm2-135m"} 0.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="smollm2-135m",reason="capacity"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2-135m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="smollm2-135m"} 0.25
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2-135m"} 6.4929219e+07
vllm:prefix_cache_queries_created{engine="0",model_name="smollm2-135m"} 1.7e+09
vllm:prefix_cache_queries_total{engine="1",model_name="smollm2-135m"} 1000.0
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2-135m"} 4.40416e+07
vllm:prefix_cache_hits_total{engine="1",model_name="smollm2-135m"} 500.0
# HELP vllm:prompt_tokens Number of prefill tokens processed.
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="smollm2-135m"} 12000.0
vllm:prompt_tokens_total{engine="1",model_name="smollm2-135m"} 3000.0
# HELP vllm:generation_tokens Number of generation tokens processed.
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="smollm2-135m"} 4000.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="smollm2-135m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="smollm2-135m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="smollm2-135m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="smollm2-135m"} 0.4
vllm:time_to_first_token_seconds_count{engine="1",model_name="smollm2-135m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="smollm2-135m"} 0.5
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="smollm2-135m"} 30.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="smollm2-135m"} 40.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="smollm2-135m"} 40.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="smollm2-135m"} 0.8
"""


def test_sample_exposition():
    assert parse_engine_metrics(SAMPLE) == EngineMetrics(
        num_requests_running=4, num_requests_waiting=2, kv_cache_usage_perc=0.375,
        prefix_cache_queries=64_929_219 + 1000, prefix_cache_hits=44_041_600 + 500,
        prompt_tokens=15_000, generation_tokens=4000,
        ttft_seconds_sum=0.9, ttft_seconds_count=6, itl_seconds_sum=0.8, itl_seconds_count=40,
    )


def test_latency_histograms_give_only_their_sums_and_counts():
    metrics = parse_engine_metrics(SAMPLE)
    assert "vllm:time_to_first_token_seconds_bucket" not in (metrics.model_extra or {})
    assert metrics.ttft_seconds_sum / metrics.ttft_seconds_count == pytest.approx(0.15)
    assert metrics.itl_seconds_sum / metrics.itl_seconds_count == pytest.approx(0.02)


def test_served_token_counters_from_an_older_engine_read_as_zero_and_an_older_agent_beat_validates():
    text = 'vllm:num_requests_running{engine="0"} 1\n'
    assert (parse_engine_metrics(text).prompt_tokens, parse_engine_metrics(text).generation_tokens) == (0, 0)
    older = {"num_requests_running": 1, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.0,
             "prefix_cache_queries": 0, "prefix_cache_hits": 0}
    assert EngineMetrics.model_validate(older).generation_tokens == 0
    assert EngineMetrics.model_validate(older).ttft_seconds_count == 0


def test_untyped_counters_as_an_older_scrape_shows_them():
    text = 'vllm:prefix_cache_hits_total{engine="0"} 7\nvllm:num_requests_running{engine="0"} 1\n'
    assert parse_engine_metrics(text) == EngineMetrics(num_requests_running=1, prefix_cache_hits=7)


def test_absent_series_read_as_zero():
    assert parse_engine_metrics("# nothing here\n") == EngineMetrics()


def test_malformed_text_is_a_value_error():
    with pytest.raises(ValueError):
        parse_engine_metrics("vllm:num_requests_running{engine=0} not-a-number\n")


def test_nan_infinite_and_negative_samples_never_break_the_report():
    text = (
        'vllm:num_requests_running{engine="0"} NaN\nvllm:num_requests_running{engine="1"} 2\n'
        'vllm:num_requests_waiting{engine="0"} -3\n'
        'vllm:kv_cache_usage_perc{engine="0"} 1.5\nvllm:kv_cache_usage_perc{engine="1"} +Inf\n'
        'vllm:prefix_cache_queries_total{engine="0"} -Inf\n'
        'vllm:prefix_cache_hits_total{engine="0"} 1e308\nvllm:prefix_cache_hits_total{engine="1"} 1e308\n'
    )
    metrics = parse_engine_metrics(text)
    assert metrics == EngineMetrics(num_requests_running=2, kv_cache_usage_perc=1.0)
    observed = EngineObserved(name="e-0", model="m", class_ref="c@r1", role="mixed", state="ready", metrics=metrics)
    assert EngineObserved.model_validate(observed.model_dump(mode="json")).metrics == metrics
