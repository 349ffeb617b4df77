"""Window math over per-revision gateway counters: deltas (resets, gateways joining and leaving, sums over
gateways), Prometheus histogram_quantile semantics, error and rejection rates. Pure; hypothesis properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetctl.controller.rollout.state import Histogram, ServedCounters
from fleetctl.controller.rollout.window import (
    add_histograms,
    error_rate,
    quantile,
    rejection_rate,
    window_delta,
)

BOUNDS = (0.1, 0.5, 1.0, 5.0)


def hist(per_bucket: list[int], over: int = 0, total: float = 0.0, bounds: tuple[float, ...] = BOUNDS) -> Histogram:
    """A histogram from per-bucket (not cumulative) counts; `over` observations above the last bound."""
    cumulative, running = [], 0
    for n in per_bucket:
        running += n
        cumulative.append(running)
    return Histogram(bounds, tuple(cumulative), running + over, total)


def counters(requests: int, errors: int = 0, rejections: int = 0, ttft: Histogram | None = None,
             itl: Histogram | None = None) -> ServedCounters:
    return ServedCounters(requests, errors, rejections, ttft or hist([0, 0, 0, 0]), itl or hist([0, 0, 0, 0]))


# --- window_delta ---


def test_the_delta_is_end_minus_start_summed_over_gateways() -> None:
    start = {"gw-a": {"m@r1": counters(10, 1, 2, hist([5, 3, 0, 0], total=1.0))},
             "gw-b": {"m@r1": counters(4), "m@r2": counters(3, 1)}}
    end = {"gw-a": {"m@r1": counters(15, 2, 2, hist([7, 5, 1, 0], total=2.5))},
           "gw-b": {"m@r1": counters(6, 0, 1), "m@r2": counters(3, 1)}}
    delta = window_delta(start, end)
    assert delta["m@r1"] == ServedCounters(7, 1, 1, hist([2, 2, 1, 0], total=1.5), hist([0, 0, 0, 0]))
    assert delta["m@r2"] == counters(0)  # served nothing in the window: present, with zero counters


def test_a_gateway_whose_counters_went_down_restarted_and_counts_from_zero() -> None:
    start = {"gw-a": {"m@r1": counters(100, 10, 5, hist([50, 30, 20, 0]))}}
    end = {"gw-a": {"m@r1": counters(8, 1, 0, hist([4, 2, 1, 0]))}}
    assert window_delta(start, end)["m@r1"] == end["gw-a"]["m@r1"]
    # one histogram going down is a restart too, even if the request count grew back past the old one
    grown = {"gw-a": {"m@r1": counters(120, 12, 6, hist([40, 30, 20, 0]))}}
    assert window_delta(start, grown)["m@r1"] == grown["gw-a"]["m@r1"]


def test_a_gateway_that_joined_counts_from_zero_and_one_that_left_adds_nothing() -> None:
    start = {"gw-old": {"m@r1": counters(50, 5)}}
    end = {"gw-new": {"m@r1": counters(3, 1)}}
    assert window_delta(start, end) == {"m@r1": counters(3, 1)}
    assert window_delta(start, {}) == {}


def test_a_revision_new_on_a_gateway_counts_from_zero() -> None:
    start = {"gw-a": {"m@r1": counters(10)}}
    end = {"gw-a": {"m@r1": counters(12), "m@r2": counters(4, 2)}}
    assert window_delta(start, end) == {"m@r1": counters(2), "m@r2": counters(4, 2)}


def test_histograms_with_other_buckets_are_summed_at_the_shared_bounds() -> None:
    other = Histogram((0.5, 2.0, 5.0), (3, 4, 6), 7, 9.0)
    summed = add_histograms(hist([1, 2, 3, 0], over=1, total=4.0), other)
    assert summed == Histogram((0.5, 5.0), (3 + 3, 6 + 6), 7 + 7, 13.0)
    assert add_histograms(Histogram(), other) == other  # an empty histogram without buckets adds nothing


# --- quantile ---


def test_quantile_interpolates_within_the_bucket_like_histogram_quantile() -> None:
    h = hist([10, 10, 0, 0])  # 10 in (0, 0.1], 10 in (0.1, 0.5]
    assert quantile(h, 0.5) == pytest.approx(0.1)
    assert quantile(h, 0.25) == pytest.approx(0.05)  # rank 5 of 10 in the first bucket, lower edge 0
    assert quantile(h, 0.75) == pytest.approx(0.3)  # rank 15: halfway through (0.1, 0.5]
    assert quantile(h, 1.0) == pytest.approx(0.5)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    assert quantile(hist([1, 0, 0, 0], over=9), 0.9) == 5.0


def test_quantile_is_none_without_observations_and_refuses_q_outside_0_1() -> None:
    assert quantile(hist([0, 0, 0, 0]), 0.9) is None
    assert quantile(Histogram((), (), 3, 1.0), 0.5) is None  # only a +Inf bucket
    with pytest.raises(ValueError, match="q must be in"):
        quantile(hist([1, 0, 0, 0]), 1.5)


def test_quantile_zero_is_the_lower_edge_of_the_first_observation_s_bucket() -> None:
    assert quantile(hist([0, 0, 4, 0]), 0.0) == pytest.approx(0.5)


# --- rates ---


def test_rates_are_per_request_and_none_without_requests() -> None:
    assert error_rate(counters(20, 3, 5)) == pytest.approx(0.15)
    assert rejection_rate(counters(20, 3, 5)) == pytest.approx(0.25)
    assert error_rate(counters(0)) is None and rejection_rate(counters(0)) is None


# --- properties ---

buckets = st.lists(st.integers(0, 50), min_size=len(BOUNDS), max_size=len(BOUNDS))
histograms = st.builds(hist, buckets, st.integers(0, 20), st.floats(0, 100))


@st.composite
def served(draw: st.DrawFn) -> ServedCounters:
    requests = draw(st.integers(0, 1000))
    return ServedCounters(requests, draw(st.integers(0, requests)), draw(st.integers(0, requests)),
                          draw(histograms), draw(histograms))


def grow(c: ServedCounters, extra: ServedCounters) -> ServedCounters:
    """`c` after serving `extra` more."""
    return ServedCounters(c.requests + extra.requests, c.errors + extra.errors, c.rejections + extra.rejections,
                          add_histograms(c.ttft, extra.ttft), add_histograms(c.itl, extra.itl))


@given(st.dictionaries(st.sampled_from(["gw-a", "gw-b", "gw-c"]),
                       st.dictionaries(st.sampled_from(["m@r1", "m@r2"]), served(), max_size=2), max_size=3))
def test_the_delta_of_a_reading_with_itself_is_zero(reading: dict) -> None:
    for ref, delta in window_delta(reading, reading).items():
        assert (delta.requests, delta.errors, delta.rejections, delta.ttft.count, delta.itl.count) == (0, 0, 0, 0, 0), ref
        assert all(n == 0 for n in delta.ttft.counts + delta.itl.counts)


@given(served(), served(), served(), served())
def test_the_delta_is_what_was_served_in_between_summed_over_gateways(a0: ServedCounters, a_extra: ServedCounters,
                                                                      b0: ServedCounters, b_extra: ServedCounters) -> None:
    start = {"gw-a": {"m@r1": a0}, "gw-b": {"m@r1": b0}}
    end = {"gw-a": {"m@r1": grow(a0, a_extra)}, "gw-b": {"m@r1": grow(b0, b_extra)}}
    delta = window_delta(start, end)["m@r1"]
    expected = grow(a_extra, b_extra)
    assert (delta.requests, delta.errors, delta.rejections) == (expected.requests, expected.errors, expected.rejections)
    assert (delta.ttft.counts, delta.ttft.count) == (expected.ttft.counts, expected.ttft.count)
    assert math.isclose(delta.ttft.sum, expected.ttft.sum, abs_tol=1e-6)


@given(histograms, st.floats(0, 1), st.floats(0, 1))
def test_quantile_is_monotone_in_q_and_within_the_bounds(h: Histogram, q1: float, q2: float) -> None:
    low, high = sorted((q1, q2))
    a, b = quantile(h, low), quantile(h, high)
    if h.count == 0:
        assert a is None and b is None
        return
    assert a is not None and b is not None
    assert 0.0 <= a <= b <= BOUNDS[-1]
