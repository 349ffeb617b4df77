"""Read an engine's key load figures from its Prometheus exposition (vLLM v1 names; the reference engine and
vLLM both serve them). Pure over the text: the supervisor fetches /metrics and hands the body here.

Series with several label sets (one per DP rank, `engine="0"`, `"1"`, ...) are summed; the KV usage
fraction is averaged over ranks so it stays in 0..1.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from agent.models import EngineMetrics
from engine import metric_names

# EngineMetrics field -> the sample name as exposed (counters carry _total on the wire).
SAMPLES = {
    "num_requests_running": metric_names.NUM_REQUESTS_RUNNING,
    "num_requests_waiting": metric_names.NUM_REQUESTS_WAITING,
    "kv_cache_usage_perc": metric_names.KV_CACHE_USAGE_PERC,
    "prefix_cache_queries": metric_names.PREFIX_CACHE_QUERIES + "_total",
    "prefix_cache_hits": metric_names.PREFIX_CACHE_HITS + "_total",
}
AVERAGED = {"kv_cache_usage_perc"}


def parse_engine_metrics(text: str) -> EngineMetrics:
    """The figures in `text`; a series that is absent reads as 0. Raises ValueError on malformed text."""
    values: dict[str, list[float]] = {name: [] for name in SAMPLES.values()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name].append(sample.value)
    return EngineMetrics(**{field: _combine(values[name], field in AVERAGED) for field, name in SAMPLES.items()})


def _combine(samples: list[float], average: bool) -> float:
    if not samples:
        return 0.0
    return sum(samples) / len(samples) if average else sum(samples)
