"""vLLM v1's Prometheus metrics for the reference engine, plus our P/D transfer metrics, in one registry.

Names, labels, types and buckets are vLLM's (engine/metric_names.py), so a dashboard written for vLLM works
unchanged. `EngineMetrics.on_step` is an AsyncEngine step listener (it runs on the engine thread;
prometheus_client's collectors are thread-safe):
- per step: iteration_tokens (one observation per step that ran), TTFT and inter-token latency (one per
  token), token, preemption and prefix-cache counters (local, and external: the K/V a P/D prefill engine
  sends), and the prompts of the requests that got their first token, by where their K/V came from;
- per finished request: request_success{finished_reason} and the request-level histograms;
- gauges from SchedulerStats, after steps and after commands (aborts) alike.
So N requests of P prompt tokens and M generated tokens give ttft count N, inter_token_latency count
N*(M-1), request_prompt_tokens sum N*P, generation_tokens_total N*M, and so on, as vLLM's own test expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine import metric_names as m
from engine.contract.outputs import FinishedRequestStats, IterationStats, SchedulerStats, StepResult

FINISH_REASONS = ("stop", "length", "abort")
WAITING_REASONS = ("capacity", "deferred")
KV_TRANSFER_BYTES_BUCKETS = [2.0**k for k in range(10, 32, 2)]  # 1 KiB .. 1 GiB, x4
KV_TRANSFER_SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                               30.0]
KV_TRANSFER_MODES = ("push", "pull", "push+pull")


@dataclass(frozen=True)
class CacheInfo:
    """The labels of vllm:cache_config_info (vLLM: CacheConfig.metrics_info(), all values as strings)."""

    block_size: int
    num_gpu_blocks: int
    enable_prefix_caching: bool
    cache_dtype: str
    max_model_len: int
    kv_cache_mib: int

    def labels(self) -> dict[str, str]:
        size_tokens = self.num_gpu_blocks * self.block_size
        return {
            "block_size": str(self.block_size),
            "enable_prefix_caching": str(self.enable_prefix_caching),
            "num_gpu_blocks": str(self.num_gpu_blocks),
            "cache_dtype": self.cache_dtype,
            "kv_cache_size_tokens": str(size_tokens),
            "kv_cache_max_concurrency": f"{size_tokens / self.max_model_len:.2f}",
            # The pool is sized in MiB (kv_cache_mib), not as a memory fraction; vLLM prints unset fields "None".
            "gpu_memory_utilization": "None",
            "kv_cache_mib": str(self.kv_cache_mib),
        }


class EngineMetrics:
    def __init__(self, model_name: str, max_model_len: int, cache: CacheInfo, engine_index: str = "0"):
        self.registry = CollectorRegistry()
        self._labels = {"model_name": model_name, "engine": engine_index}
        self._build_gauges(cache)
        self._build_counters()
        self._build_histograms(max_model_len)
        self._build_kv_transfer()

    # --- construction ---------------------------------------------------------------------------------

    def _gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labelnames=(*m.LABELS, *extra), registry=self.registry)

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, labelnames=(*m.LABELS, *extra), registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: list, extra: tuple[str, ...] = ()) -> Histogram:
        return Histogram(name, doc, labelnames=(*m.LABELS, *extra), buckets=buckets, registry=self.registry)

    def _build_gauges(self, cache: CacheInfo) -> None:
        labels, gauge = self._labels, self._gauge
        self.running = gauge(m.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.").labels(**labels)
        self.waiting = gauge(m.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.").labels(**labels)
        by_reason = gauge(m.NUM_REQUESTS_WAITING_BY_REASON, "Number of requests waiting, by reason.", ("reason",))
        self.waiting_by_reason = {r: by_reason.labels(**labels, reason=r) for r in WAITING_REASONS}
        self.kv_usage = gauge(m.KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.").labels(**labels)
        info = cache.labels()
        info_gauge = Gauge(m.CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig",
                           labelnames=(*sorted(info), "engine"), registry=self.registry)
        info_gauge.labels(**info, engine=labels["engine"]).set(1)
        # The reference engine has no sleep mode: always awake (vLLM sets awake to 1 while serving).
        sleep = gauge(m.ENGINE_SLEEP_STATE, "Engine sleep state; awake = 0 means engine is sleeping; "
                      "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 "
                      "means sleep level 2.", ("sleep_state",))
        for state in m.SLEEP_STATES:
            sleep.labels(**labels, sleep_state=state).set(1 if state == "awake" else 0)

    def _build_counters(self) -> None:
        labels, counter = self._labels, self._counter
        self.prefix_queries = counter(
            m.PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens.").labels(**labels)
        self.prefix_hits = counter(
            m.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.").labels(**labels)
        self.preemptions = counter(
            m.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.").labels(**labels)
        self.prompt_tokens = counter(m.PROMPT_TOKENS, "Number of prefill tokens processed.").labels(**labels)
        self.generation_tokens = counter(m.GENERATION_TOKENS, "Number of generation tokens processed.").labels(**labels)
        success = counter(m.REQUEST_SUCCESS, "Count of successfully processed requests.", ("finished_reason",))
        self.success = {r: success.labels(**labels, finished_reason=r) for r in FINISH_REASONS}
        self.external_queries = counter(
            m.EXTERNAL_PREFIX_CACHE_QUERIES, "External prefix cache queries from KV connector cross-instance cache "
            "sharing, in terms of number of queried tokens.").labels(**labels)
        self.external_hits = counter(
            m.EXTERNAL_PREFIX_CACHE_HITS, "External prefix cache hits from KV connector cross-instance cache "
            "sharing, in terms of number of cached tokens.").labels(**labels)
        by_source = counter(m.PROMPT_TOKENS_BY_SOURCE, "Number of prompt tokens by source.", ("source",))
        self.prompt_by_source = {s: by_source.labels(**labels, source=s) for s in m.PROMPT_SOURCES}
        self.prompt_cached = counter(
            m.PROMPT_TOKENS_CACHED, "Number of cached prompt tokens (local + external).").labels(**labels)
        self.prompt_recomputed = counter(
            m.PROMPT_TOKENS_RECOMPUTED, "Number of cached tokens recomputed for forward pass.").labels(**labels)

    def _build_histograms(self, max_model_len: int) -> None:
        tokens, latency = m.build_1_2_5_buckets(max_model_len), m.REQUEST_LATENCY_BUCKETS

        def h(name: str, doc: str, buckets: list) -> Any:
            return self._histogram(name, doc, buckets).labels(**self._labels)

        self.req_prompt_tokens = h(m.REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.", tokens)
        self.req_generation_tokens = h(m.REQUEST_GENERATION_TOKENS, "Number of generation tokens processed.", tokens)
        self.req_max_generation_tokens = h(
            m.REQUEST_MAX_NUM_GENERATION_TOKENS, "Histogram of maximum number of requested generation tokens.",
            tokens)
        self.req_prefill_kv_computed = h(
            m.REQUEST_PREFILL_KV_COMPUTED_TOKENS, "Histogram of new KV tokens computed during prefill "
            "(excluding cached tokens).", tokens)
        self.req_params_n = h(m.REQUEST_PARAMS_N, "Histogram of the n request parameter.", m.PARAMS_N_BUCKETS)
        self.req_max_tokens = h(m.REQUEST_PARAMS_MAX_TOKENS, "Histogram of the max_tokens request parameter.", tokens)
        self.iteration_tokens = h(
            m.ITERATION_TOKENS, "Histogram of number of tokens per engine_step.", m.ITERATION_TOKENS_BUCKETS)
        self.ttft = h(m.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.", m.TTFT_BUCKETS)
        self.itl = h(m.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", m.ITL_BUCKETS)
        self.tpot = h(m.REQUEST_TIME_PER_OUTPUT_TOKEN, "Histogram of time_per_output_token_seconds per request.",
                      m.ITL_BUCKETS)
        self.e2e = h(m.E2E_REQUEST_LATENCY, "Histogram of e2e request latency in seconds.", latency)
        self.queue_time = h(m.REQUEST_QUEUE_TIME, "Histogram of time spent in WAITING phase for request.", latency)
        self.inference_time = h(
            m.REQUEST_INFERENCE_TIME, "Histogram of time spent in RUNNING phase for request.", latency)
        self.prefill_time = h(m.REQUEST_PREFILL_TIME, "Histogram of time spent in PREFILL phase for request.", latency)
        self.decode_time = h(m.REQUEST_DECODE_TIME, "Histogram of time spent in DECODE phase for request.", latency)
        self.req_preemptions = h(
            m.REQUEST_NUM_PREEMPTIONS, "Number of preemptions per request.", m.NUM_PREEMPTIONS_BUCKETS)

    def _build_kv_transfer(self) -> None:
        labels, mode = self._labels, ("mode",)
        nbytes = self._histogram(
            "fleet_kv_transfer_bytes", "Bytes of K/V received per P/D handoff.", KV_TRANSFER_BYTES_BUCKETS, mode)
        seconds = self._histogram(
            "fleet_kv_transfer_seconds", "Seconds a decode request waited for its K/V per P/D handoff.",
            KV_TRANSFER_SECONDS_BUCKETS, mode)
        self.kv_transfer_bytes = {mode: nbytes.labels(**labels, mode=mode) for mode in KV_TRANSFER_MODES}
        self.kv_transfer_seconds = {mode: seconds.labels(**labels, mode=mode) for mode in KV_TRANSFER_MODES}
        self._kv_transfer_failures = self._counter(
            "fleet_kv_transfer_failures", "P/D K/V transfers that failed (the request recomputed or failed).",
            ("reason",))

    # --- recording ------------------------------------------------------------------------------------

    def on_step(self, result: StepResult) -> None:
        """AsyncEngine step listener (engine thread)."""
        if result.is_step:
            self.record_iteration(result.iteration)
        else:  # aborts between steps: no iteration ran, but requests finished
            for finished in result.iteration.finished:
                self.record_finished(finished)
        self.record_scheduler(result.scheduler)

    def record_iteration(self, it: IterationStats) -> None:
        if it.iteration_tokens > 0:
            self.iteration_tokens.observe(it.iteration_tokens)
        self.prompt_tokens.inc(sum(it.prompt_lengths_first_token))
        self.generation_tokens.inc(it.num_generation_tokens)
        self.preemptions.inc(it.num_preemptions)
        self.prefix_queries.inc(it.prefix_cache_queries)
        self.prefix_hits.inc(it.prefix_cache_hits)
        self.external_queries.inc(it.external_prefix_cache_queries)
        self.external_hits.inc(it.external_prefix_cache_hits)
        self.prompt_by_source["local_compute"].inc(it.prompt_tokens_local_compute)
        self.prompt_by_source["local_cache_hit"].inc(it.prompt_tokens_local_cache_hit)
        self.prompt_by_source["external_kv_transfer"].inc(it.prompt_tokens_external)
        self.prompt_cached.inc(it.prompt_tokens_local_cache_hit + it.prompt_tokens_external)
        self.prompt_recomputed.inc(it.prompt_tokens_recomputed)
        for ttft in it.time_to_first_tokens:
            self.ttft.observe(ttft)
        for itl in it.inter_token_latencies:
            self.itl.observe(itl)
        for finished in it.finished:
            self.record_finished(finished)

    def record_finished(self, f: FinishedRequestStats) -> None:
        self.success[f.finish_reason if f.finish_reason in self.success else "abort"].inc()
        self.req_prompt_tokens.observe(f.num_prompt_tokens)
        self.req_generation_tokens.observe(f.num_generation_tokens)
        self.req_max_generation_tokens.observe(f.num_generation_tokens)  # n is 1: the longest is the only one
        self.req_prefill_kv_computed.observe(max(0, f.num_prompt_tokens - f.num_cached_tokens))
        # vLLM's mean time per output token: decode time over the tokens after the first (0 for one token)
        self.tpot.observe(f.decode_time / (f.num_generation_tokens - 1) if f.num_generation_tokens > 1 else 0.0)
        self.req_params_n.observe(f.n)
        self.req_max_tokens.observe(f.max_tokens)
        self.req_preemptions.observe(f.num_preemptions)
        self.e2e.observe(f.e2e_latency)
        self.queue_time.observe(f.queue_time)
        self.inference_time.observe(f.inference_time)
        self.prefill_time.observe(f.prefill_time)
        self.decode_time.observe(f.decode_time)

    def record_scheduler(self, s: SchedulerStats) -> None:
        self.running.set(s.num_running)
        self.waiting.set(s.num_waiting)
        # The reference scheduler only waits for capacity (no structured-output or remote-KV deferral).
        self.waiting_by_reason["capacity"].set(s.num_waiting)
        self.waiting_by_reason["deferred"].set(0)
        self.kv_usage.set(s.kv_cache_usage)

    def record_kv_transfer(self, mode: str, nbytes: int, seconds: float) -> None:
        self.kv_transfer_bytes[mode].observe(nbytes)
        self.kv_transfer_seconds[mode].observe(seconds)

    def record_kv_transfer_failure(self, reason: str) -> None:
        self._kv_transfer_failures.labels(**self._labels, reason=reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
