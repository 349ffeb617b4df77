"""The change stream's rates and pulse (watch_rates.py), pure: engine rates from two readings (counter resets
included), the window picking, the gateways' requests, rejections and latency quantiles, and the counts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from fleetctl.controller.rollout.state import Histogram, ServedCounters
from fleetctl.controller.watch_rates import (
    EngineCounters, Reading, engine_rates, engine_window, gateway_window, pick_window, pulse,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BOUNDS = (0.1, 0.5, 1.0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def counters(tokens: float = 0, hits: float = 0, queries: float = 0, ttft: tuple[float, float] = (0, 0),
             itl: tuple[float, float] = (0, 0)) -> EngineCounters:
    return EngineCounters(tokens, hits, queries, ttft[0], ttft[1], itl[0], itl[1])


def test_engine_counters_read_the_reported_metrics() -> None:
    metrics = {"prompt_tokens": 100, "generation_tokens": 50, "prefix_cache_hits": 30, "prefix_cache_queries": 60,
               "ttft_seconds_sum": 1.5, "ttft_seconds_count": 10, "itl_seconds_sum": 0.2, "itl_seconds_count": 20}
    assert EngineCounters.of(metrics) == counters(150, 30, 60, (1.5, 10), (0.2, 20))
    assert EngineCounters.of({"num_requests_running": 2}) == counters()  # an older agent: zeros


def test_engine_rates_over_a_window() -> None:
    earlier = Reading(at(0), counters(1000, 100, 400, (2.0, 10), (1.0, 100)))
    later = Reading(at(10), counters(3000, 250, 600, (5.0, 20), (1.5, 150)))
    rates = engine_rates(engine_window(earlier, later))
    assert (rates.window_s, rates.tokens_s, rates.prefix_hit_rate) == (10.0, 200.0, 0.75)
    assert rates.ttft_s == pytest.approx(0.3) and rates.itl_s == pytest.approx(0.01)


def test_a_counter_that_went_down_makes_its_figure_unknown_for_that_window() -> None:
    earlier = Reading(at(0), counters(5000, 100, 400, (2.0, 10), (1.0, 100)))
    restarted = Reading(at(12), counters(300, 20, 50, (0.4, 2), (0.1, 10)))
    rates = engine_rates(engine_window(earlier, restarted))
    assert rates.window_s == 12.0
    assert (rates.tokens_s, rates.prefix_hit_rate, rates.ttft_s, rates.itl_s) == (None, None, None, None)
    only_hits_reset = Reading(at(12), counters(6000, 50, 500, (2.0, 10), (1.0, 100)))
    rates = engine_rates(engine_window(earlier, only_hits_reset))
    assert rates.tokens_s == pytest.approx(1000 / 12, abs=1e-4) and rates.prefix_hit_rate is None


def test_ratios_without_growth_in_the_denominator_are_unknown_and_no_window_is_all_unknown() -> None:
    same = Reading(at(0), counters(10, 5, 10, (1.0, 1), (1.0, 1)))
    idle = engine_rates(engine_window(same, Reading(at(10), same.value)))
    assert (idle.tokens_s, idle.prefix_hit_rate, idle.ttft_s, idle.itl_s) == (0.0, None, None, None)
    assert engine_rates(None).model_dump() == {"window_s": None, "tokens_s": None, "prefix_hit_rate": None,
                                               "ttft_s": None, "itl_s": None}


def test_the_window_is_the_latest_reading_and_the_newest_one_far_enough_before_it() -> None:
    readings = [Reading(at(s), s) for s in (0, 5, 10, 16)]
    assert pick_window(readings) == (readings[1], readings[3])  # 16 - 5 >= 10, 16 - 10 is not
    assert pick_window(readings[:2]) is None  # 5 s apart: not measured yet
    assert pick_window([]) is None
    assert pick_window(readings, min_window_s=3) == (readings[2], readings[3])


def histogram(counts: tuple[int, ...], count: int, total: float) -> Histogram:
    return Histogram(BOUNDS, counts, count, total)


def served(requests: int, rejections: int = 0, ttft: Histogram | None = None, itl: Histogram | None = None) -> ServedCounters:
    return ServedCounters(requests, 0, rejections, ttft or Histogram(), itl or Histogram())


def test_a_gateway_window_sums_its_revisions_and_counts_a_new_or_restarted_one_from_zero() -> None:
    earlier = Reading(at(0), {"chat@r1": served(100, 2, histogram((10, 90, 100), 100, 30.0))})
    later = Reading(at(10), {"chat@r1": served(150, 3, histogram((20, 140, 150), 150, 45.0)),
                             "chat@r2": served(10, 0, histogram((10, 10, 10), 10, 0.5))})
    window = gateway_window(earlier, later)
    assert window.seconds == 10.0 and (window.served.requests, window.served.rejections) == (60, 1)
    assert window.served.ttft == histogram((20, 60, 60), 60, 15.5)
    restarted = gateway_window(later, Reading(at(20), {"chat@r1": served(5)}))
    assert restarted.served.requests == 5  # went down: counted from zero, as Prometheus' increase()


NODES = [{"name": "n1", "state": "up"}, {"name": "n2", "state": "down"}]
ENGINES = [{"node": "n1", "name": "a", "state": "ready", "drift": []},
           {"node": "n1", "name": "b", "state": "failed", "drift": []},
           {"node": "n2", "name": "c", "state": "ready", "drift": [{"field": "dtype"}]}]
GATEWAYS = [{"name": "g1", "stale": False, "table_age_s": 1.5}, {"name": "g2", "stale": False, "table_age_s": 4.0},
            {"name": "g3", "stale": True, "table_age_s": 99.0}]


def test_the_pulse_sums_the_gateways_and_engines_and_counts_the_fleet() -> None:
    g1 = gateway_window(Reading(at(0), {"x@r1": served(0)}),
                        Reading(at(10), {"x@r1": served(100, 10, histogram((50, 90, 100), 100, 20.0),
                                                        histogram((100, 100, 100), 100, 1.0))}))
    g2 = gateway_window(Reading(at(0), {"x@r1": served(0)}),
                        Reading(at(20), {"x@r1": served(100, 0, histogram((50, 90, 100), 100, 20.0),
                                                        histogram((100, 100, 100), 100, 1.0))}))
    e1 = engine_window(Reading(at(0), counters(0, 0, 0)), Reading(at(10), counters(1000, 30, 100)))
    e2 = engine_window(Reading(at(0), counters(0, 0, 0)), Reading(at(10), counters(500, 10, 100)))
    view = pulse(at(30), NODES, ENGINES, [e1, e2], GATEWAYS, [g1, g2], {"kill": False})
    assert (view.requests_s, view.rejections_s) == (15.0, 1.0)  # 100/10 + 100/20; 10/10 + 0/20
    assert view.ttft_p50_s == pytest.approx(0.1) and view.ttft_p90_s == pytest.approx(0.5)
    assert view.itl_p90_s == pytest.approx(0.09)
    assert (view.tokens_s, view.prefix_hit_rate) == (150.0, 0.2)
    assert (view.window_s, view.routing_table_age_s) == (20.0, 4.0)  # g3 is stale: not counted
    assert (view.nodes, view.nodes_up, view.engines, view.engines_ready) == (2, 1, 3, 2)
    assert (view.engines_unhealthy, view.drifted, view.frozen, view.flags) == (2, 1, False, {"kill": False})
    held = pulse(at(30), NODES, ENGINES, [e1, e2], GATEWAYS, [g1, g2], {"freeze": True, "pin:chat": "chat@r1"})
    assert (held.frozen, held.pins) == (True, {"chat": "chat@r1"})
    assert view.at == at(30).isoformat()


def test_a_pulse_with_nothing_measured_yet_says_none_not_zero() -> None:
    view = pulse(at(0), [], [], [], [], [], {})
    assert (view.requests_s, view.tokens_s, view.ttft_p50_s, view.itl_p90_s, view.prefix_hit_rate) == (None,) * 5
    assert (view.window_s, view.routing_table_age_s, view.nodes) == (None, None, 0)
    unmeasured = engine_window(Reading(at(0), counters(10)), Reading(at(10), counters(5)))  # restarted
    assert pulse(at(0), [], [], [unmeasured], [], [], {}).tokens_s is None


def test_the_pulse_keeps_the_engines_mean_ttft_of_every_request() -> None:
    e1 = engine_window(Reading(at(0), counters()), Reading(at(10), counters(ttft=(3.0, 10))))
    e2 = engine_window(Reading(at(0), counters()), Reading(at(10), counters(ttft=(1.0, 30))))
    view = pulse(at(10), NODES, ENGINES, [e1, e2], [], [], {})
    assert view.ttft_engines_s == pytest.approx(0.1)  # 4 s over 40 requests, weighted by requests
    assert view.ttft_p50_s is None  # no gateway saw a stream
