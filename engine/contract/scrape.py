"""Read an engine's key load figures from its Prometheus exposition (vLLM v1 names; the reference engine and
vLLM both serve them). Pure over the text: the agent's supervisor (its engines) and the controller (engines it
adopted) fetch /metrics and hand the body here.

Counters are read from their `_total` samples, the TTFT and inter-token latency histograms from their `_sum`
and `_count` (the controller's change stream turns their growth into mean latencies). Series with several
label sets (one per DP rank, `engine="0"`, `"1"`, ...) are summed; the KV usage
fraction is averaged over ranks so it stays in 0..1. The result always validates as `EngineMetrics`: an
engine is not trusted to report sane numbers, so a NaN or infinite sample is dropped (as if absent), a
negative figure reads as 0 and the KV usage fraction is held in 0..1. One odd sample never costs the
agent its heartbeat, nor an adopted engine its place.
"""

from __future__ import annotations

import math

from engine import metric_names
from engine.contract import EngineMetrics, sample_lines

# EngineMetrics field -> the sample name as exposed (counters carry _total on the wire).
SAMPLES = {
    "num_requests_running": metric_names.NUM_REQUESTS_RUNNING,
    "num_requests_waiting": metric_names.NUM_REQUESTS_WAITING,
    "kv_cache_usage_perc": metric_names.KV_CACHE_USAGE_PERC,
    "prefix_cache_queries": metric_names.PREFIX_CACHE_QUERIES + "_total",
    "prefix_cache_hits": metric_names.PREFIX_CACHE_HITS + "_total",
    "prompt_tokens": metric_names.PROMPT_TOKENS + "_total",
    "generation_tokens": metric_names.GENERATION_TOKENS + "_total",
    # histograms: only their sums and counts (a mean over a window); the buckets stay at the engine
    "ttft_seconds_sum": metric_names.TIME_TO_FIRST_TOKEN + "_sum",
    "ttft_seconds_count": metric_names.TIME_TO_FIRST_TOKEN + "_count",
    "itl_seconds_sum": metric_names.INTER_TOKEN_LATENCY + "_sum",
    "itl_seconds_count": metric_names.INTER_TOKEN_LATENCY + "_count",
    # a reference engine's node KV tier link (summed over the drop reasons)
    "kv_tier_offloaded": metric_names.KV_TIER_OFFLOADED_BLOCKS + "_total",
    "kv_tier_offload_dropped": metric_names.KV_TIER_OFFLOAD_DROPPED_BLOCKS + "_total",
}
AVERAGED = {"kv_cache_usage_perc"}
FRACTIONS = {"kv_cache_usage_perc"}
_FIELD_OF = {name: field for field, name in SAMPLES.items()}


def parse_engine_metrics(text: str) -> EngineMetrics:
    """The figures in `text`; a series that is absent reads as 0. Raises ValueError on malformed text."""
    values: dict[str, list[float]] = {field: [] for field in SAMPLES}
    for name, _labels, value in sample_lines(text):
        field = _FIELD_OF.get(name)
        if field is not None and math.isfinite(value):
            values[field].append(value)
    return EngineMetrics(**{field: _bounded(field, _combine(samples, field in AVERAGED))
                            for field, samples in values.items()})


def _combine(samples: list[float], average: bool) -> float:
    if not samples:
        return 0.0
    return sum(samples) / len(samples) if average else sum(samples)


def _bounded(field: str, value: float) -> float:
    """`value` held to what the field may hold: never negative, a fraction at most 1; a sum of finite
    samples that overflowed to infinity reads as 0 (the figure is meaningless)."""
    if not math.isfinite(value):
        return 0.0
    value = max(0.0, value)
    return min(1.0, value) if field in FRACTIONS else value
