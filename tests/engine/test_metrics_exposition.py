"""/metrics of a real engine process, checked as vLLM's own test checks a vLLM server
(tests/entrypoints/.../test_metrics.py): every EXPECTED_METRICS_V1 series, vLLM's types, labels and buckets,
and the counts N requests of P prompt tokens and M generated tokens must give."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import metric_names as m

if TYPE_CHECKING:
    from conftest import EngineProcess

N, P, M = 3, 20, 5
MAX_MODEL_LEN = 1024
SERVED_NAME = "tiny-metrics"


@pytest.fixture(scope="module")
def engine(launch_engine) -> EngineProcess:
    engine = launch_engine("--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", SERVED_NAME)
    for i in range(N):
        prompt = [1000 + 100 * i + j for j in range(P)]  # distinct prompts: no prefix-cache hits
        body = {"prompt": prompt, "max_tokens": M, "ignore_eos": True, "temperature": 0}
        response = engine.post("/v1/completions", body)
        assert response.json()["usage"]["completion_tokens"] == M
    return engine


@pytest.fixture(scope="module")
def exposition(engine: EngineProcess) -> str:
    return engine.get("/metrics").text


@pytest.fixture(scope="module")
def families(exposition: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(exposition)}


def value(families: dict, sample_name: str, **labels: str) -> float:
    for family in families.values():
        for sample in family.samples:
            if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(sample_name)


def test_every_expected_vllm_series_is_exposed(families: dict) -> None:
    names = {s.name for f in families.values() for s in f.samples}
    missing = [e for e in m.EXPECTED_METRICS_V1 if not any(n == e or n.startswith(e + "_") for n in names)]
    assert missing == []


@pytest.mark.parametrize(
    "name,kind",
    [(n, "gauge") for n in (m.NUM_REQUESTS_RUNNING, m.NUM_REQUESTS_WAITING, m.NUM_REQUESTS_WAITING_BY_REASON,
                            m.KV_CACHE_USAGE_PERC, m.CACHE_CONFIG_INFO, m.ENGINE_SLEEP_STATE)]
    + [(n, "counter") for n in (m.PREFIX_CACHE_QUERIES, m.PREFIX_CACHE_HITS, m.NUM_PREEMPTIONS, m.PROMPT_TOKENS,
                                m.GENERATION_TOKENS, m.REQUEST_SUCCESS, m.EXTERNAL_PREFIX_CACHE_QUERIES,
                                m.EXTERNAL_PREFIX_CACHE_HITS, m.PROMPT_TOKENS_BY_SOURCE, m.PROMPT_TOKENS_CACHED,
                                m.PROMPT_TOKENS_RECOMPUTED)]
    + [(n, "histogram") for n in (m.REQUEST_PROMPT_TOKENS, m.REQUEST_GENERATION_TOKENS, m.REQUEST_PARAMS_N,
                                  m.REQUEST_PARAMS_MAX_TOKENS, m.ITERATION_TOKENS, m.TIME_TO_FIRST_TOKEN,
                                  m.INTER_TOKEN_LATENCY, m.E2E_REQUEST_LATENCY, m.REQUEST_QUEUE_TIME,
                                  m.REQUEST_INFERENCE_TIME, m.REQUEST_PREFILL_TIME, m.REQUEST_DECODE_TIME,
                                  m.REQUEST_NUM_PREEMPTIONS, m.REQUEST_MAX_NUM_GENERATION_TOKENS,
                                  m.REQUEST_PREFILL_KV_COMPUTED_TOKENS, m.REQUEST_TIME_PER_OUTPUT_TOKEN)],
)
def test_metric_types(families: dict, name: str, kind: str) -> None:
    assert families[name].type == kind


def test_every_series_carries_model_name_and_engine(families: dict) -> None:
    for name, family in families.items():
        if not name.startswith("vllm:") or name == m.CACHE_CONFIG_INFO:
            continue
        for sample in family.samples:
            assert sample.labels.get("model_name") == SERVED_NAME, sample
            assert sample.labels.get("engine") == "0", sample


@pytest.mark.parametrize(
    "name,buckets",
    [
        (m.REQUEST_PROMPT_TOKENS, m.build_1_2_5_buckets(MAX_MODEL_LEN)),
        (m.REQUEST_GENERATION_TOKENS, m.build_1_2_5_buckets(MAX_MODEL_LEN)),
        (m.REQUEST_PARAMS_MAX_TOKENS, m.build_1_2_5_buckets(MAX_MODEL_LEN)),
        (m.REQUEST_PARAMS_N, m.PARAMS_N_BUCKETS),
        (m.ITERATION_TOKENS, m.ITERATION_TOKENS_BUCKETS),
        (m.TIME_TO_FIRST_TOKEN, m.TTFT_BUCKETS),
        (m.INTER_TOKEN_LATENCY, m.ITL_BUCKETS),
        (m.E2E_REQUEST_LATENCY, m.REQUEST_LATENCY_BUCKETS),
        (m.REQUEST_DECODE_TIME, m.REQUEST_LATENCY_BUCKETS),
        (m.REQUEST_NUM_PREEMPTIONS, m.NUM_PREEMPTIONS_BUCKETS),
        (m.REQUEST_MAX_NUM_GENERATION_TOKENS, m.build_1_2_5_buckets(MAX_MODEL_LEN)),
        (m.REQUEST_PREFILL_KV_COMPUTED_TOKENS, m.build_1_2_5_buckets(MAX_MODEL_LEN)),
        (m.REQUEST_TIME_PER_OUTPUT_TOKEN, m.ITL_BUCKETS),
    ],
)
def test_histogram_buckets_are_vllms(families: dict, name: str, buckets: list) -> None:
    les = [s.labels["le"] for s in families[name].samples if s.name == name + "_bucket"]
    assert les == [str(float(b)) for b in buckets] + ["+Inf"]


def test_request_token_buckets_follow_max_model_len() -> None:
    assert m.build_1_2_5_buckets(MAX_MODEL_LEN) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]


def test_counts_for_n_requests_of_p_prompt_and_m_generated_tokens(families: dict) -> None:
    expected = {
        "vllm:time_to_first_token_seconds_count": N,
        "vllm:inter_token_latency_seconds_count": N * (M - 1),
        "vllm:e2e_request_latency_seconds_count": N,
        "vllm:request_queue_time_seconds_count": N,
        "vllm:request_inference_time_seconds_count": N,
        "vllm:request_prefill_time_seconds_count": N,
        "vllm:request_decode_time_seconds_count": N,
        "vllm:request_num_preemptions_count": N,
        "vllm:request_prompt_tokens_sum": N * P,
        "vllm:request_prompt_tokens_count": N,
        "vllm:request_generation_tokens_sum": N * M,
        "vllm:request_params_n_sum": N,
        "vllm:request_params_max_tokens_sum": N * M,
        "vllm:iteration_tokens_total_sum": N * (P + M),
        "vllm:prompt_tokens_total": N * P,
        "vllm:generation_tokens_total": N * M,
        "vllm:num_preemptions_total": 0,
        "vllm:request_max_num_generation_tokens_sum": N * M,
        "vllm:request_prefill_kv_computed_tokens_sum": N * P,  # distinct prompts: nothing cached
        "vllm:request_time_per_output_token_seconds_count": N,
        "vllm:prompt_tokens_cached_total": 0,
        "vllm:prompt_tokens_recomputed_total": 0,
        "vllm:external_prefix_cache_queries_total": 0,  # no P/D transfer
        "vllm:external_prefix_cache_hits_total": 0,
    }
    actual = {name: value(families, name) for name in expected}
    assert actual == expected
    assert value(families, "vllm:request_success_total", finished_reason="length") == N
    assert value(families, "vllm:request_success_total", finished_reason="stop") == 0
    assert value(families, "vllm:iteration_tokens_total_count") >= N  # depends on batching


def test_prompt_tokens_by_source_add_up_to_the_prompt_tokens(families: dict) -> None:
    by_source = {s: value(families, "vllm:prompt_tokens_by_source_total", source=s) for s in m.PROMPT_SOURCES}
    assert by_source == {"local_compute": N * P, "local_cache_hit": 0, "external_kv_transfer": 0}


def test_the_engine_is_awake(families: dict) -> None:
    states = {s.labels["sleep_state"]: s.value for s in families[m.ENGINE_SLEEP_STATE].samples}
    assert states == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}


def test_every_vllm_family_exported_is_listed_and_every_listed_one_is_exported(families: dict) -> None:
    # prometheus_client's parser lists each counter's and histogram's `_created` samples as a family of their own
    exported = {name for name in families if name.startswith("vllm:") and not name.endswith("_created")}
    assert exported == set(m.FAMILIES_EXPORTED)
    assert not exported & set(m.NOT_EXPORTED)
    # vLLM 0.33's catalogue: what is exported and what is not, each family once
    assert len(m.FAMILIES_EXPORTED) + len(m.NOT_EXPORTED) == len(set(m.FAMILIES_EXPORTED) | set(m.NOT_EXPORTED))


def test_a_repeated_prompt_counts_its_cached_blocks(engine: EngineProcess) -> None:
    """Run after the module's requests (their figures are read by the tests above, from the first scrape)."""
    def counters() -> dict[str, float]:
        fams = {f.name: f for f in text_string_to_metric_families(engine.get("/metrics").text)}
        return {"cached": value(fams, "vllm:prompt_tokens_cached_total"),
                "hit": value(fams, "vllm:prompt_tokens_by_source_total", source="local_cache_hit"),
                "computed": value(fams, "vllm:prompt_tokens_by_source_total", source="local_compute"),
                "kv_computed": value(fams, "vllm:request_prefill_kv_computed_tokens_sum"),
                "recomputed": value(fams, "vllm:prompt_tokens_recomputed_total")}

    prompt = [7000 + j for j in range(40)]  # 2 full blocks and 8 tokens
    body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True, "temperature": 0}
    engine.post("/v1/completions", body)
    before = counters()
    engine.post("/v1/completions", body)  # its 2 full blocks are cached now
    after = counters()
    assert {k: after[k] - before[k] for k in after} == {"cached": 32, "hit": 32, "computed": 8, "kv_computed": 8,
                                                        "recomputed": 0}
    whole = {"prompt": prompt[:32], "max_tokens": 2, "ignore_eos": True, "temperature": 0}
    engine.post("/v1/completions", whole)  # both its blocks are cached: the last one is computed again
    last = counters()
    assert {k: last[k] - after[k] for k in last} == {"cached": 16, "hit": 16, "computed": 16, "kv_computed": 16,
                                                     "recomputed": 16}


def test_prefix_cache_counters_are_tokens(families: dict) -> None:
    assert value(families, "vllm:prefix_cache_queries_total") >= N * P
    assert value(families, "vllm:prefix_cache_hits_total") == 0


def test_gauges_are_idle_after_the_requests(families: dict) -> None:
    assert value(families, m.NUM_REQUESTS_RUNNING) == 0
    assert value(families, m.NUM_REQUESTS_WAITING) == 0
    assert value(families, m.KV_CACHE_USAGE_PERC) == 0
    reasons = {s.labels["reason"] for s in families[m.NUM_REQUESTS_WAITING_BY_REASON].samples}
    assert reasons == {"capacity", "deferred"}


def test_cache_config_info(families: dict, engine: EngineProcess) -> None:
    (sample,) = families[m.CACHE_CONFIG_INFO].samples
    assert sample.value == 1
    labels = sample.labels
    required = {"block_size", "enable_prefix_caching", "num_gpu_blocks", "cache_dtype", "kv_cache_size_tokens",
                "kv_cache_max_concurrency", "gpu_memory_utilization", "engine"}
    assert required <= set(labels)
    assert labels["block_size"] == "16" and labels["engine"] == "0"
    assert int(labels["kv_cache_size_tokens"]) == int(labels["num_gpu_blocks"]) * 16
    concurrency = int(labels["kv_cache_size_tokens"]) / MAX_MODEL_LEN
    assert float(labels["kv_cache_max_concurrency"]) == pytest.approx(concurrency, abs=0.01)


def test_kv_transfer_metrics_are_in_the_same_registry(families: dict) -> None:
    assert families["fleet_kv_transfer_bytes"].type == "histogram"
    assert families["fleet_kv_transfer_seconds"].type == "histogram"
    assert families["fleet_kv_transfer_failures"].type == "counter"


def test_gauges_return_to_zero_after_an_abort(engine: EngineProcess) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with engine.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()  # kept referenced: a dropped iterator closes the connection
        assert next(line for line in lines if line.startswith("data: "))
        assert engine.metric(m.NUM_REQUESTS_RUNNING) == 1
        assert engine.metric(m.KV_CACHE_USAGE_PERC) > 0
    engine.wait_idle()  # leaving the block closed the connection: the engine aborted the request
