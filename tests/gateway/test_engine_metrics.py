"""Reading an engine's /metrics: load gauges, cache config, and rates between two scrapes."""

from __future__ import annotations

import pytest

from fleetctl.gateway.engine_metrics import MIN_PREFILL_TOKENS, EngineSample, derive_rates, ewma, parse_engine_metrics

SCRAPE = """
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="float32",engine="0",kv_cache_mib="16",num_gpu_blocks="128"} 1.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.4
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 4.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 1.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 50.0
"""


def test_parse_sums_dp_ranks_and_reads_the_cache_config() -> None:
    sample = parse_engine_metrics(SCRAPE)
    assert (sample.num_running, sample.num_waiting) == (4, 2)
    assert sample.kv_cache_usage == pytest.approx(0.375)
    assert (sample.block_size, sample.num_gpu_blocks, sample.kv_cache_mib) == (16, 128, 16.0)
    assert sample.kv_capacity_tokens == 2048
    assert sample.kv_bytes_per_block == 16 * 1024 * 1024 / 128
    assert (sample.prompt_tokens, sample.prefix_cache_hits, sample.itl_count) == (1000, 200, 50)


def test_an_engine_without_cache_info_has_unknown_capacity() -> None:
    sample = parse_engine_metrics('vllm:num_requests_running{engine="0",model_name="m"} 1\n')
    assert sample.kv_capacity_tokens is None and sample.kv_bytes_per_block is None


def test_garbage_raises() -> None:
    with pytest.raises(ValueError):
        parse_engine_metrics("this is { not prometheus")


def test_rates_between_scrapes() -> None:
    before = EngineSample(prompt_tokens=1000, prefix_cache_hits=200, prefill_time_sum=0.4, itl_sum=1.0, itl_count=50)
    after = EngineSample(prompt_tokens=2000, prefix_cache_hits=400, prefill_time_sum=0.8, itl_sum=1.5, itl_count=75,
                         kv_transfer_count=2, kv_transfer_seconds_sum=0.1, kv_transfer_bytes_sum=4096)
    rates = derive_rates(before, after)
    assert rates.prefill_tokens_per_s == pytest.approx(800 / 0.4)
    assert rates.decode_step_s == pytest.approx(0.02)
    assert (rates.kv_transfers, rates.kv_transfer_seconds, rates.kv_transfer_bytes) == (2, pytest.approx(0.1), 4096)


def test_small_or_backwards_intervals_give_no_rate() -> None:
    base = EngineSample(prompt_tokens=1000, prefill_time_sum=1.0)
    few = EngineSample(prompt_tokens=1000 + MIN_PREFILL_TOKENS - 1, prefill_time_sum=2.0)
    restarted = EngineSample(prompt_tokens=10, prefill_time_sum=0.1)
    assert derive_rates(base, few).prefill_tokens_per_s is None
    assert derive_rates(base, restarted).prefill_tokens_per_s is None
    assert derive_rates(base, base).decode_step_s is None


def test_ewma() -> None:
    assert ewma(None, 10.0) == 10.0 and ewma(10.0, None) == 10.0 and ewma(None, None) is None
    assert ewma(10.0, 20.0, 0.5) == 15.0


TIERED = SCRAPE + """
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 500.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 200.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 300.0
# TYPE fleet_kv_tier_fetch_seconds summary
fleet_kv_tier_fetch_seconds_count{tier="dram"} 10.0
fleet_kv_tier_fetch_seconds_sum{tier="dram"} 0.02
fleet_kv_tier_fetch_seconds_count{tier="disk"} 0.0
fleet_kv_tier_fetch_seconds_sum{tier="disk"} 0.0
# TYPE fleet_kv_tier_peer_fetch_seconds summary
fleet_kv_tier_peer_fetch_seconds_count{source="node-b"} 30.0
fleet_kv_tier_peer_fetch_seconds_sum{source="node-b"} 0.3
"""


def test_tier_fetch_costs_and_cross_node_links_are_read_per_tier_and_source() -> None:
    sample = parse_engine_metrics(TIERED)
    assert sample.tier_fetch_s == (("CPU", pytest.approx(0.002)),)  # disk fetched nothing: not measured
    assert sample.peer_fetches == (("node-b", 30.0, 0.3),)
    assert sample.peer_links() == {"node-b": (30 * sample.kv_bytes_per_block, 0.3)}
    assert parse_engine_metrics('vllm:num_requests_running{engine="0"} 1\n').peer_links() == {}


def test_prefill_throughput_counts_only_tokens_the_engine_computed() -> None:
    # 300 of the prompt tokens came from a tier or a peer: they took no prefill time and must not count as computed
    before = parse_engine_metrics(SCRAPE.replace("1000.0", "0.0").replace("200.0", "0.0").replace(" 0.4", " 0.0"))
    before = EngineSample(**{**before.__dict__, "computed_prompt_tokens": 0.0})
    after = parse_engine_metrics(TIERED)
    assert after.computed_prompt_tokens == 500.0
    assert derive_rates(before, after).prefill_tokens_per_s == pytest.approx(500 / 0.4)
