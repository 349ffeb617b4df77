"""The gateway's per-revision counters (served.ServedRecorder): what each outcome counts, the cumulative
buckets, the per-class Prometheus series, forgetting classes that left the table, and a snapshot the
controller's report contract accepts and the window math reads."""

from __future__ import annotations

import pytest

from engine import metric_names as m
from fleetctl.controller.contract import ServedCountersModel
from fleetctl.controller.gateways import served_counters
from fleetctl.controller.rollout.window import quantile
from fleetctl.gateway.metrics import GatewayMetrics
from fleetctl.gateway.served import MAX_REPORTED_CLASSES, Buckets, Outcome, ServedRecorder, TokenTimes
from gateway.procs import metric_value, scrape


def recorder() -> ServedRecorder:
    return ServedRecorder(GatewayMetrics())


def test_outcomes_count_requests_errors_and_rejections_by_class() -> None:
    served = recorder()
    for outcome in [Outcome("m", "m@r1", 200, ttft_s=0.03, itl_s=0.02), Outcome("m", "m@r1", 200, cut=True),
                    Outcome("m", "m@r1", 503), Outcome("m", "m@r1", 429), Outcome("m", "m@r2", 200, ttft_s=0.3),
                    Outcome("m", "m@r2", 400)]:
        served.record(outcome)
    snap = served.snapshot()
    r1, r2 = snap["m@r1"], snap["m@r2"]
    assert (r1["requests"], r1["errors"], r1["rejections"]) == (4, 2, 1)  # the cut stream and the 503; the 429
    assert (r2["requests"], r2["errors"], r2["rejections"]) == (2, 0, 0)  # a 400 is the client's, not an error
    assert (r1["ttft"]["count"], r1["itl"]["count"], r2["ttft"]["count"], r2["itl"]["count"]) == (1, 1, 1, 0)
    assert r1["ttft"]["bounds"] == m.TTFT_BUCKETS and r1["itl"]["bounds"] == m.ITL_BUCKETS


def test_the_same_figures_are_prometheus_series_labelled_by_class_ref() -> None:
    served = recorder()
    served.record(Outcome("m", "m@r1", 200, ttft_s=0.03, itl_s=0.02))
    served.record(Outcome("m", "m@r1", 503))
    served.record(Outcome("m", "m@r2", 429))
    samples = scrape(served.metrics.exposition().decode())
    assert metric_value(samples, "fleet_gateway_class_requests_total", class_ref="m@r1") == 2
    assert metric_value(samples, "fleet_gateway_class_requests_total", class_ref="m@r1", code="503") == 1
    assert metric_value(samples, "fleet_gateway_class_errors_total", class_ref="m@r1") == 1
    assert metric_value(samples, "fleet_gateway_class_rejections_total", model="m", class_ref="m@r2") == 1
    assert metric_value(samples, "fleet_gateway_class_ttft_seconds_count", class_ref="m@r1") == 1
    assert metric_value(samples, "fleet_gateway_class_itl_seconds_bucket", class_ref="m@r1", le="0.025") == 1


def test_classes_that_left_the_table_are_forgotten_with_their_series() -> None:
    served = recorder()
    served.record(Outcome("m", "m@r1", 200, ttft_s=0.1))
    served.record(Outcome("m", "m@r2", 200))
    served.keep_only(["m@r2", "m@r3"])
    assert list(served.snapshot()) == ["m@r2"]
    samples = scrape(served.metrics.exposition().decode())
    assert metric_value(samples, "fleet_gateway_class_requests_total", class_ref="m@r1") == 0
    assert metric_value(samples, "fleet_gateway_class_requests_total", class_ref="m@r2") == 1


def test_buckets_are_cumulative_and_an_observation_on_a_bound_is_in_its_bucket() -> None:
    buckets = Buckets((0.1, 0.5, 1.0))
    for value in (0.05, 0.1, 0.3, 0.5, 7.0):
        buckets.observe(value)
    assert buckets.to_json() == {"bounds": [0.1, 0.5, 1.0], "counts": [2, 4, 4], "count": 5, "sum": pytest.approx(7.95)}


def test_a_stream_s_itl_is_the_spread_of_its_content_chunks_over_the_gaps() -> None:
    times = TokenTimes()
    assert times.mean_itl() is None
    times.note(1, 10.0)
    assert times.mean_itl() is None  # one chunk: no gap to measure
    times.note(0, 10.5)  # a chunk without content (a finish reason) does not count
    times.note(1, 10.2)
    times.note(2, 10.6)
    assert times.mean_itl() == pytest.approx(0.6 / 3)


def test_the_snapshot_is_a_valid_report_and_reads_back_for_the_window_math() -> None:
    served = recorder()
    for ttft in (0.03, 0.03, 0.07, 0.2):
        served.record(Outcome("m", "m@r1", 200, ttft_s=ttft, itl_s=0.04))
    data = ServedCountersModel.model_validate(served.snapshot()["m@r1"]).model_dump()
    counters = served_counters(data)
    assert counters.requests == 4 and counters.ttft.count == 4
    assert 0.02 < quantile(counters.ttft, 0.5) <= 0.04  # two of four in (0.02, 0.04]


def test_the_snapshot_holds_at_most_the_busiest_classes_the_controller_accepts() -> None:
    served = recorder()
    for i in range(MAX_REPORTED_CLASSES + 3):
        served.record(Outcome("m", f"m@r{i}", 200))
    served.record(Outcome("m", "m@r0", 200))
    snap = served.snapshot()
    assert len(snap) == MAX_REPORTED_CLASSES and snap["m@r0"]["requests"] == 2
