"""fleetctl.controller.rollout.window: window deltas over gateways (with resets), quantiles, rates."""

from __future__ import annotations

from fleetctl.controller.rollout.state import Histogram, ServedCounters
from fleetctl.controller.rollout.window import error_rate, quantile, rejection_rate, window_delta
from tests.rollout.world import BOUNDS, A, B, add, histogram, served


def test_window_delta_sums_what_every_gateway_served_in_the_window() -> None:
    start = {"gw-1": {A: served(10), B: served(4)}, "gw-2": {A: served(3)}}
    end = {"gw-1": {A: served(25), B: served(9, errors=2)}, "gw-2": {A: served(10), B: served(6)}}
    delta = window_delta(start, end)
    assert delta[A].requests == 15 + 7 and delta[A].ttft.count == 22
    assert delta[B].requests == 5 + 6 and delta[B].errors == 2 and delta[B].ttft.count == 3 + 6


def test_a_counter_that_went_down_is_a_gateway_restart() -> None:
    start = {"gw-1": {A: served(100)}}
    end = {"gw-1": {A: served(7)}, "gw-gone": {}}
    assert window_delta(start, end)[A] == served(7)


def test_a_gateway_gone_by_the_end_contributes_nothing() -> None:
    assert window_delta({"gw-1": {A: served(5)}}, {}) == {}


def test_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    h = add(served(10, ttft=0.04), served(10, ttft=0.2)).ttft  # 10 in (0.025, 0.05], 10 in (0.1, 0.25]
    assert quantile(h, 0.5) == 0.05  # rank 10: the top of the first filled bucket
    assert abs(quantile(h, 0.9) - (0.1 + 0.15 * 8 / 10)) < 1e-12
    assert quantile(Histogram(), 0.9) is None


def test_quantile_in_the_inf_bucket_answers_the_largest_bound() -> None:
    h = Histogram(BOUNDS, tuple(0 for _ in BOUNDS), 4, 40.0)
    assert quantile(h, 0.99) == BOUNDS[-1]
    assert quantile(histogram(3, 0.005), 0.5) == 0.005  # first bucket: lower bound 0


def test_rates_are_over_requests_and_none_without_any() -> None:
    c = ServedCounters(requests=200, errors=5, rejections=20)
    assert error_rate(c) == 0.025 and rejection_rate(c) == 0.1
    assert error_rate(ServedCounters()) is None and rejection_rate(ServedCounters()) is None
