"""The contract's Prometheus line scan reads what a full parser reads, refuses what is not an exposition, and
leaves labels unparsed until asked."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.contract.prometheus import Sample, parse_labels, parse_samples, sample_lines, split_sample, sum_series
from engine.reference.metrics import CacheInfo, EngineMetrics
from engine.contract.outputs import FinishedRequestStats, IterationStats, SchedulerStats, StepResult


def reference_exposition() -> str:
    """A real exposition of the reference engine after one finished request: gauges, counters, histograms."""
    cache = CacheInfo(block_size=16, num_gpu_blocks=64, enable_prefix_caching=True, cache_dtype="auto",
                      max_model_len=256, kv_cache_mib=4)
    metrics = EngineMetrics("model-a", 256, cache)
    done = FinishedRequestStats("length", 10, 3, max_tokens=3, n=1, num_preemptions=0, e2e_latency=0.5,
                                queue_time=0.01, prefill_time=0.1, decode_time=0.3, inference_time=0.4)
    iteration = IterationStats(num_prompt_tokens=10, num_generation_tokens=3, prompt_lengths_first_token=[10],
                               time_to_first_tokens=[0.05], inter_token_latencies=[0.01, 0.02], finished=[done])
    metrics.on_step(StepResult(iteration=iteration, scheduler=SchedulerStats(num_running=1, kv_cache_usage=0.25)))
    return metrics.exposition().decode()


def test_every_sample_equals_the_full_parsers() -> None:
    text = reference_exposition()
    full = sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for family in text_string_to_metric_families(text) for s in family.samples)
    ours = sorted((s.name, tuple(sorted(s.labels.items())), s.value) for series in parse_samples(text).values() for s in series)
    assert len(ours) > 100  # histograms' buckets included
    assert ours == full


def test_labels_stay_raw_until_parsed() -> None:
    line = 'vllm:cache_config_info{block_size="16",note="a \\"quoted\\" }brace",engine="0"} 1.0 1700000000'
    name, raw, value = split_sample(line)
    assert (name, value) == ("vllm:cache_config_info", 1.0)
    assert parse_labels(raw) == {"block_size": "16", "note": 'a "quoted" }brace', "engine": "0"}


def test_comments_blank_lines_and_bare_samples() -> None:
    text = "# HELP x a gauge\n# TYPE x gauge\n\nx 2\nx_total{a=\"1\"} 3\n"
    assert list(sample_lines(text)) == [("x", "", 2.0), ("x_total", 'a="1"', 3.0)]


def test_non_finite_values_are_read_as_written() -> None:
    values = [v for _, _, v in sample_lines("a NaN\nb +Inf\nc -Inf\n")]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]


@pytest.mark.parametrize("text", ["this is { not prometheus", "name_only\n", 'x{a="1"} \n', "x one\n"])
def test_what_is_not_an_exposition_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        list(sample_lines(text))


def test_sum_series_over_matching_labels() -> None:
    samples = {"r": [Sample("r", {"engine": "0", "m": "a"}, 1.0), Sample("r", {"engine": "1", "m": "a"}, 2.0)]}
    assert sum_series(samples, "r") == 3.0
    assert sum_series(samples, "r", engine="1") == 2.0
    assert sum_series(samples, "absent") == 0
