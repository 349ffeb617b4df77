"""ServedCapacity: the fleet's served tokens/s from successive engine readings, and its peak over the window."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from fleetctl.controller.canary_capacity import SLICES, EngineReading, ServedCapacity, served_tokens

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
E1, E2 = ("n1", "e-0"), ("n2", "e-0")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reading(engine: tuple[str, str], seconds: float, tokens: float) -> EngineReading:
    return EngineReading(engine, at(seconds), tokens)


def test_one_reading_is_no_rate_and_the_next_gives_one() -> None:
    capacity = ServedCapacity(3600)
    assert capacity.observe([reading(E1, 0, 1000)], at(0)) == 0.0
    assert capacity.observe([reading(E1, 10, 3000)], at(10)) == pytest.approx(200.0)
    assert capacity.capacity(at(10)) == pytest.approx(200.0)


def test_the_fleet_rate_sums_the_engines_and_the_capacity_is_the_peak() -> None:
    capacity = ServedCapacity(3600)
    capacity.observe([reading(E1, 0, 0), reading(E2, 0, 0)], at(0))
    assert capacity.observe([reading(E1, 10, 1000), reading(E2, 10, 500)], at(10)) == pytest.approx(150.0)
    assert capacity.observe([reading(E1, 20, 1100), reading(E2, 20, 600)], at(20)) == pytest.approx(20.0)
    assert capacity.capacity(at(20)) == pytest.approx(150.0)  # busy before, quiet now: the peak counts


def test_the_same_report_read_twice_keeps_its_rate() -> None:
    capacity = ServedCapacity(3600)
    capacity.observe([reading(E1, 0, 0)], at(0))
    capacity.observe([reading(E1, 5, 500)], at(5))
    assert capacity.observe([reading(E1, 5, 500)], at(7)) == pytest.approx(100.0)


def test_a_restarted_engine_counts_nothing_until_its_next_reading() -> None:
    capacity = ServedCapacity(3600)
    capacity.observe([reading(E1, 0, 10_000)], at(0))
    assert capacity.observe([reading(E1, 5, 100)], at(5)) == 0.0  # the counter went down: restarted
    assert capacity.observe([reading(E1, 10, 600)], at(10)) == pytest.approx(100.0)


def test_engines_no_longer_read_are_forgotten() -> None:
    capacity = ServedCapacity(3600)
    capacity.observe([reading(E1, 0, 0), reading(E2, 0, 0)], at(0))
    capacity.observe([reading(E1, 10, 1000), reading(E2, 10, 1000)], at(10))
    assert capacity.observe([reading(E1, 20, 2000)], at(20)) == pytest.approx(100.0)
    assert capacity.observe([reading(E1, 30, 3000), reading(E2, 30, 9000)], at(30)) == pytest.approx(100.0)  # E2 anew


def test_the_peak_leaves_the_window_and_memory_stays_bounded() -> None:
    capacity = ServedCapacity(600)
    capacity.observe([reading(E1, 0, 0)], at(0))
    capacity.observe([reading(E1, 10, 10_000)], at(10))  # 1,000 tokens/s
    tokens = 10_000.0
    for step in range(1, 200):
        tokens += 50
        capacity.observe([reading(E1, 10 + 5 * step, tokens)], at(10 + 5 * step))  # 10 tokens/s from here on
    assert capacity.capacity(at(10 + 5 * 199)) == pytest.approx(10.0)
    assert len(capacity._peaks) <= SLICES + 1


def test_served_tokens_reads_both_counters_and_ignores_what_is_missing_or_odd() -> None:
    assert served_tokens({"prompt_tokens": 10, "generation_tokens": 5.5, "num_requests_running": 3}) == 15.5
    assert served_tokens({"num_requests_running": 3}) == 0.0  # an older agent
    assert served_tokens({"prompt_tokens": "many", "generation_tokens": float("nan")}) == 0.0
    assert served_tokens(None) == 0.0
