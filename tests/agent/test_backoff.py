"""Full-jitter backoff as a pure function of the attempt number and an injected random source."""

from __future__ import annotations

import random

import pytest

from agent.backoff import CONTROLLER_BACKOFF, Backoff


def test_window_doubles_until_the_cap():
    policy = Backoff(base=0.5, cap=30.0)
    assert [policy.window(n) for n in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert policy.window(10_000) == 30.0  # no overflow however long the outage


def test_delay_is_uniform_over_the_window():
    calls = []

    def uniform(low: float, high: float) -> float:
        calls.append((low, high))
        return high * 0.25

    assert Backoff(base=0.5, cap=30.0).delay(3, uniform) == 1.0
    assert calls == [(0.0, 4.0)]


@pytest.mark.parametrize("attempt", [0, 1, 5, 20])
def test_delays_stay_within_zero_and_the_window(attempt):
    rng = random.Random(attempt)
    delays = [CONTROLLER_BACKOFF.delay(attempt, rng.uniform) for _ in range(500)]
    assert all(0.0 <= d <= CONTROLLER_BACKOFF.window(attempt) for d in delays)


def test_a_crowd_retrying_together_is_spread_over_the_window():
    """100 agents at the same attempt: with full jitter their delays cover the window, not one instant."""
    rng = random.Random(7)
    delays = sorted(CONTROLLER_BACKOFF.delay(4, rng.uniform) for _ in range(100))
    window = CONTROLLER_BACKOFF.window(4)
    assert delays[-1] - delays[0] > 0.8 * window
    buckets = [sum(1 for d in delays if i * window / 10 <= d < (i + 1) * window / 10) for i in range(10)]
    assert max(buckets) < 25  # no tenth of the window holds a quarter of the crowd
