"""vLLM v1 Prometheus metric names, labels, types and buckets (vllm/v1/metrics/loggers.py, buckets.py).

Tracks vLLM 0.33 (the catalogue in ../shared/reference/vllm-contracts.md): the families the reference engine
exports are the constants below (FAMILIES_EXPORTED); the ones it cannot have are NOT_EXPORTED, each with the
reason (docs/contracts.md lists both).
Counters are declared without `_total`; prometheus_client exposes them with it, as vLLM does.
Every series carries the labels `model_name` (the served model name) and `engine` (an index, "0").
"""

from __future__ import annotations

LABELS = ("model_name", "engine")

# Gauges
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
NUM_REQUESTS_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # + reason in {capacity, deferred}
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"  # a fraction in 0..1
CACHE_CONFIG_INFO = "vllm:cache_config_info"
ENGINE_SLEEP_STATE = "vllm:engine_sleep_state"  # + sleep_state in {awake, weights_offloaded, discard_all}

# Counters (exposed with _total)
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # tokens
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"  # tokens
NUM_PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"  # + finished_reason in {stop, length, abort}
EXTERNAL_PREFIX_CACHE_QUERIES = "vllm:external_prefix_cache_queries"  # tokens asked of the KV connector (P/D)
EXTERNAL_PREFIX_CACHE_HITS = "vllm:external_prefix_cache_hits"  # tokens it supplied
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"  # + source in PROMPT_SOURCES
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached"  # local and external cache hits
PROMPT_TOKENS_RECOMPUTED = "vllm:prompt_tokens_recomputed"  # cached tokens computed again for the forward pass
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")

# Histograms
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
REQUEST_MAX_NUM_GENERATION_TOKENS = "vllm:request_max_num_generation_tokens"  # the longest of a request's n
REQUEST_PREFILL_KV_COMPUTED_TOKENS = "vllm:request_prefill_kv_computed_tokens"  # prompt K/V computed, not cached
REQUEST_PARAMS_N = "vllm:request_params_n"
REQUEST_PARAMS_MAX_TOKENS = "vllm:request_params_max_tokens"
ITERATION_TOKENS = "vllm:iteration_tokens_total"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
REQUEST_TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"  # a request's mean TPOT
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"
REQUEST_INFERENCE_TIME = "vllm:request_inference_time_seconds"
REQUEST_PREFILL_TIME = "vllm:request_prefill_time_seconds"
REQUEST_DECODE_TIME = "vllm:request_decode_time_seconds"
REQUEST_NUM_PREEMPTIONS = "vllm:request_num_preemptions"

# the node KV tier link of a reference engine (engine/reference/kv_tier_client.py); fleetctl's own
KV_TIER_OFFLOADED_BLOCKS = "fleet_kv_tier_offloaded_blocks"
KV_TIER_OFFLOAD_DROPPED_BLOCKS = "fleet_kv_tier_offload_dropped_blocks"  # + reason in {queue_full, send_failed}
KV_TIER_FETCH_SECONDS = "fleet_kv_tier_fetch_seconds"  # summary, tier in {dram, disk}; count is blocks
KV_TIER_PEER_FETCHED_BLOCKS = "fleet_kv_tier_peer_fetched_blocks"  # + source (node); cross-node fetches
KV_TIER_PEER_FETCH_SECONDS = "fleet_kv_tier_peer_fetch_seconds"  # summary + source; count is blocks
KV_TIER_PEER_FETCH_FAILURES = "fleet_kv_tier_peer_fetch_failures"  # + source

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]
NUM_PREEMPTIONS_BUCKETS = [1, 2, 3, 4, 5, 10, 20]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """[1, 2, 5, 10, 20, 50, ...] up to max_value, as vLLM's request-token histograms use."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


# The series a scrape must contain: vLLM's tests/entrypoints/.../test_metrics.py EXPECTED_METRICS_V1, and the
# series of the families vLLM 0.33 added since that the reference engine exports.
EXPECTED_METRICS_V1 = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total",
    "vllm:cache_config_info",
    "vllm:request_success_total",
    "vllm:request_prompt_tokens_sum",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_prompt_tokens_count",
    "vllm:request_generation_tokens_sum",
    "vllm:request_generation_tokens_bucket",
    "vllm:request_generation_tokens_count",
    "vllm:request_params_n_sum",
    "vllm:request_params_n_bucket",
    "vllm:request_params_n_count",
    "vllm:request_params_max_tokens_sum",
    "vllm:request_params_max_tokens_bucket",
    "vllm:request_params_max_tokens_count",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_inference_time_seconds_sum",
    "vllm:request_inference_time_seconds_bucket",
    "vllm:request_inference_time_seconds_count",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_prefill_time_seconds_count",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_decode_time_seconds_bucket",
    "vllm:request_decode_time_seconds_count",
    "vllm:request_num_preemptions_sum",
    "vllm:request_num_preemptions_bucket",
    "vllm:request_num_preemptions_count",
    "vllm:engine_sleep_state",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:prompt_tokens_recomputed_total",
    "vllm:request_max_num_generation_tokens_sum",
    "vllm:request_max_num_generation_tokens_bucket",
    "vllm:request_max_num_generation_tokens_count",
    "vllm:request_prefill_kv_computed_tokens_sum",
    "vllm:request_prefill_kv_computed_tokens_bucket",
    "vllm:request_prefill_kv_computed_tokens_count",
    "vllm:request_time_per_output_token_seconds_sum",
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_count",
]


# Every vLLM 0.33 family the reference engine exports (the spec-decode ones live in vllm/v1/spec_decode).
FAMILIES_EXPORTED = (
    NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, NUM_REQUESTS_WAITING_BY_REASON, KV_CACHE_USAGE_PERC,
    CACHE_CONFIG_INFO, ENGINE_SLEEP_STATE,
    PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, EXTERNAL_PREFIX_CACHE_QUERIES, EXTERNAL_PREFIX_CACHE_HITS,
    NUM_PREEMPTIONS, PROMPT_TOKENS, GENERATION_TOKENS, PROMPT_TOKENS_BY_SOURCE, PROMPT_TOKENS_CACHED,
    PROMPT_TOKENS_RECOMPUTED, REQUEST_SUCCESS,
    REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, REQUEST_MAX_NUM_GENERATION_TOKENS, REQUEST_PARAMS_N,
    REQUEST_PARAMS_MAX_TOKENS, REQUEST_PREFILL_KV_COMPUTED_TOKENS, ITERATION_TOKENS, REQUEST_NUM_PREEMPTIONS,
    TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, REQUEST_TIME_PER_OUTPUT_TOKEN, E2E_REQUEST_LATENCY,
    REQUEST_QUEUE_TIME, REQUEST_INFERENCE_TIME, REQUEST_PREFILL_TIME, REQUEST_DECODE_TIME,
)

# The vLLM 0.33 families the reference engine does not export, and why.
NOT_EXPORTED = {
    "vllm:lora_requests_info": "LoRA adapters: the reference engine serves no adapters",
    "vllm:mm_cache_queries": "multimodal inputs: the reference engine is text-only",
    "vllm:mm_cache_hits": "multimodal inputs: the reference engine is text-only",
    "vllm:corrupted_requests": "counts NaN logits only under VLLM_COMPUTE_NANS_IN_LOGITS=1, a vLLM debugging switch",
    "vllm:kv_block_lifetime_seconds": "sampled block lifecycles behind --kv-cache-metrics (off by default in vLLM); "
                                      "not implemented in the reference engine's block pool",
    "vllm:kv_block_idle_before_evict_seconds": "as kv_block_lifetime_seconds",
    "vllm:kv_block_reuse_gap_seconds": "as kv_block_lifetime_seconds",
    "vllm:spec_decode_num_drafts": "speculative decoding: the reference engine has none",
    "vllm:spec_decode_num_draft_tokens": "speculative decoding: the reference engine has none",
    "vllm:spec_decode_num_accepted_tokens": "speculative decoding: the reference engine has none",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "speculative decoding: the reference engine has none",
}
