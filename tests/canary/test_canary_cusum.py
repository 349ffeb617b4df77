"""The Bernoulli CUSUM's exact chain and its designs against the reference's worked table (computed there
with scipy's sparse solver and cross-checked by Monte Carlo), the grid's rounding, and `update`."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from fleetctl.canary import cusum
from fleetctl.canary.types import CusumState

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(("p0", "m", "h_b", "arl0", "arl1"), [
    (0.02, 14, 1.86, 1156, 18.9),
    (0.02, 14, 2.57, 5967, 26.0),
    (0.05, 9, 2.33, 593, 24.2),
    (0.05, 9, 2.67, 1076, 28.6),
    (0.05, 9, 3.67, 5348, 40.7),
    (0.05, 9, 4.11, 10764, 46.1),
    (0.10, 6, 3.67, 1025, 42.6),
    (0.10, 6, 5.17, 5698, 64.2),
])
def test_the_chain_reproduces_the_reference_table(p0: float, m: int, h_b: float, arl0: float, arl1: float) -> None:
    p1 = cusum.shifted(p0, 0.15)
    assert cusum.grid(p0, p1) == m
    h_steps = round(h_b * m)
    assert cusum.chain_arl(p0, m, h_steps) == pytest.approx(arl0, rel=0.001, abs=1)
    assert cusum.chain_arl(p1, m, h_steps) == pytest.approx(arl1, abs=0.05)


def test_design_picks_the_smallest_threshold_reaching_the_target() -> None:
    d = cusum.design(0.05, 0.15, 1000.0)
    assert (d.m, d.h_steps) == (9, 24)  # h_B = 2.67: ARL0 1076 >= 1000, while 23 steps give less
    assert d.arl0 == pytest.approx(1076, abs=1) and d.arl1 == pytest.approx(28.6, abs=0.05)
    assert cusum.chain_arl(0.05, 9, 23) < 1000 <= d.arl0
    assert d.p1 == pytest.approx(0.1925) and d.target_arl0 == 1000.0


@pytest.mark.parametrize("p0", [0.005, 0.01, 0.05, 0.2, 0.45])
@pytest.mark.parametrize("target", [100.0, 43_200.0, 518_400.0])
def test_every_design_meets_its_target_at_the_smallest_threshold(p0: float, target: float) -> None:
    d = cusum.design(p0, 0.15, target)
    assert d.arl0 >= target
    assert d.h_steps == 1 or cusum.chain_arl(p0, d.m, d.h_steps - 1) < target
    assert d.arl1 < d.arl0 and 1 / d.m > p0  # good probes pull the statistic down under control


def test_target_arl0_is_the_probes_in_the_false_alarm_period() -> None:
    assert cusum.target_arl0(30, 60) == 43_200
    assert cusum.target_arl0(30, 5) == 518_400


def test_the_chain_at_the_extremes() -> None:
    assert cusum.chain_arl(0.0, 9, 24) == float("inf")
    assert cusum.chain_arl(1.0, 9, 24) == pytest.approx(3.0)  # every probe bad: 8 steps a probe, 24 to go
    with pytest.raises(ValueError):
        cusum.design(0.6, 0.15, 1000)


def test_alarm_probability_is_the_run_length_distribution() -> None:
    d = cusum.design(0.05, 0.15, 1000.0)
    # run lengths are close to geometric: P(RL <= ARL) is about 1 - 1/e
    assert cusum.alarm_probability(0.05, d.m, d.h_steps, round(d.arl0)) == pytest.approx(0.63, abs=0.02)
    assert cusum.alarm_probability(0.05, d.m, d.h_steps, 2) == 0.0  # 2 bad probes are 16 < 24 steps


def test_update_moves_on_the_grid_alarms_and_restarts() -> None:
    d = cusum.design(0.05, 0.15, 1000.0)  # m 9, h 24 steps
    state = CusumState()
    state = cusum.update(state, False, d, NOW)
    assert (state.steps, state.probes, state.bad) == (0, 1, 0)  # floored at 0
    for expected in (8, 16):
        state = cusum.update(state, True, d, NOW)
        assert state.steps == expected and state.alarmed_at is None
    state = cusum.update(state, False, d, NOW)
    assert state.steps == 15 and cusum.statistic(state, d) == pytest.approx(15 / 9)
    state = cusum.update(state, True, d, NOW)
    assert state.steps == 23 and not cusum.alarming(state, d)
    state = cusum.update(state, True, d, NOW)
    assert state.steps == 31 and cusum.alarming(state, d) and state.alarmed_at == NOW
    assert cusum.statistic(state, d) >= cusum.threshold(d)
    state = cusum.update(state, False, d, NOW)  # the next probe starts from 0
    assert state.steps == 0 and state.alarmed_at == NOW and (state.probes, state.bad) == (7, 4)


def test_regrid_keeps_the_statistic_in_count_units() -> None:
    assert cusum.regrid(CusumState(steps=18), 9, 6).steps == 12
    assert cusum.regrid(CusumState(steps=18), 9, 9).steps == 18
