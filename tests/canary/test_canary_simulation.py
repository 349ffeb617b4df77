"""The drift test validated by simulation, with seeded RNGs: clean streams alarm at the rate the exact chain
promises (at the noise the design assumed, and less often below it), never within an hour at the default
settings, and a 15% mixture alarms with a mean delay close to the design's ARL1.

Many streams are simulated at once (numpy, one vector step per probe) by `Simulated`, whose step is checked
against `cusum.update` first; the default-settings run goes through `verdict.fold` itself."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from fleetctl.canary import cusum
from fleetctl.canary.types import CusumDesign, CusumState, ProbeRecord, Score, StreamState
from fleetctl.canary.verdict import StreamDesigns, fold
from fleetctl.controller.settings import ControllerSettings

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
SMALL = cusum.design(0.05, 0.15, 1000.0)  # ARL0 1076, ARL1 28.6: small enough to see many alarms quickly


class Simulated:
    """`streams` CUSUMs on one design, stepped together: the grid rules of cusum.update, vectorised."""

    def __init__(self, design: CusumDesign, streams: int):
        self.design = design
        self.steps = np.zeros(streams, dtype=np.int64)
        self.alarms = np.zeros(streams, dtype=np.int64)
        self.first_alarm = np.full(streams, -1, dtype=np.int64)
        self.probes = 0

    def step(self, bad: np.ndarray) -> None:
        m, h = self.design.m, self.design.h_steps
        start = np.where(self.steps >= h, 0, self.steps)  # restart after an alarm
        self.steps = np.where(bad, start + m - 1, np.maximum(start - 1, 0))
        self.probes += 1
        alarmed = self.steps >= h
        self.alarms += alarmed
        self.first_alarm = np.where((self.first_alarm < 0) & alarmed, self.probes, self.first_alarm)


def clean(rng: np.random.Generator, p0: float, streams: int) -> np.ndarray:
    return rng.random(streams) < p0


def mixture(rng: np.random.Generator, p0: float, streams: int, fraction: float = 0.15, q_bad: float = 1.0) -> np.ndarray:
    """A misroute: `fraction` of the probes served by a class that answers badly with probability q_bad."""
    misrouted = rng.random(streams) < fraction
    return np.where(misrouted, rng.random(streams) < q_bad, rng.random(streams) < p0)


def test_the_vectorised_simulation_steps_like_cusum_update() -> None:
    rng = np.random.default_rng(1)
    outcomes = rng.random((400, 3)) < 0.3
    sim = Simulated(SMALL, 3)
    states = [CusumState() for _ in range(3)]
    for row in outcomes:
        sim.step(row)
        states = [cusum.update(s, bool(b), SMALL, T0) for s, b in zip(states, row)]
        assert [s.steps for s in states] == sim.steps.tolist()
    assert sim.alarms.sum() > 0


@pytest.mark.parametrize(("true_p0", "seed"), [(0.05, 11), (0.03, 12)])
def test_clean_streams_false_alarm_at_the_rate_of_the_chain(true_p0: float, seed: int) -> None:
    """1000 streams x 4000 probes. At the design's own p0 the alarm rate is 1/ARL0 (each alarm restarts the
    statistic at 0, so alarms are a renewal process); below it (the floor is an upper bound), the rate the
    chain gives at the true p0, which is lower. Tolerance: 10%, about 5 standard errors at p0 = 0.05."""
    rng = np.random.default_rng(seed)
    sim = Simulated(SMALL, 1000)
    for _ in range(4000):
        sim.step(clean(rng, true_p0, 1000))
    rate = sim.alarms.sum() / (1000 * 4000)
    expected = 1 / cusum.chain_arl(true_p0, SMALL.m, SMALL.h_steps)
    assert rate == pytest.approx(expected, rel=0.10)
    assert rate <= 1.1 / SMALL.arl0


@pytest.mark.parametrize(("q_bad", "seed"), [(1.0, 21), (0.6, 22)])
def test_a_15_percent_mixture_alarms_after_about_arl1(q_bad: float, seed: int) -> None:
    """A 15% misroute to a class whose answers are wrong (q_bad 1: the design's p1; 0.6: a milder class,
    detected later, as the chain predicts). 2000 streams to their first alarm; mean delay within 5%."""
    rng = np.random.default_rng(seed)
    design = cusum.design(0.05, 0.15, cusum.target_arl0(30, 5))  # the production stream at the defaults
    sim = Simulated(design, 2000)
    p_mix = 0.85 * 0.05 + 0.15 * q_bad
    expected = cusum.chain_arl(p_mix, design.m, design.h_steps)
    while (sim.first_alarm < 0).any() and sim.probes < 50 * expected:
        sim.step(mixture(rng, 0.05, 2000, q_bad=q_bad))
    assert (sim.first_alarm > 0).all()
    assert sim.first_alarm.mean() == pytest.approx(expected, rel=0.05)
    if q_bad == 1.0:
        assert expected == pytest.approx(design.arl1)


def default_designs(p0: float) -> dict[str, CusumDesign]:
    s = ControllerSettings()
    return {kind: cusum.design(p0, s.canary_shift, cusum.target_arl0(s.canary_false_alarm_days, interval))
            for kind, interval in (("pinned", s.canary_pinned_interval_s), ("production", s.canary_production_interval_s))}


@pytest.mark.parametrize("p0", [0.01, 0.02, 0.05, 0.10])
def test_at_the_defaults_a_clean_stream_false_alarms_within_an_hour_with_at_most_0_14_percent_chance(p0: float) -> None:
    """The documented bound (docs/canary.md): one false alarm per 30 days per stream, so at most 0.14% per
    stream-hour, from the run-length distribution of the exact chain."""
    s = ControllerSettings()
    for kind, design in default_designs(p0).items():
        interval = s.canary_pinned_interval_s if kind == "pinned" else s.canary_production_interval_s
        assert design.arl0 * interval >= 30 * 86400
        assert cusum.alarm_probability(p0, design.m, design.h_steps, round(3600 / interval)) <= 0.0014


def test_at_the_defaults_clean_production_streams_stay_healthy_for_an_hour() -> None:
    """20 production streams, an hour each at the default interval, noise at the design's p0, folded by the
    verdict code itself: none leaves healthy (the chance that one would is about 2%; seeded)."""
    s = ControllerSettings()
    design = default_designs(0.05)["production"]
    designs = StreamDesigns(design, None)
    rng = np.random.default_rng(31)
    probes_per_stream = round(3600 / s.canary_production_interval_s)
    for stream in range(20):
        bad = rng.random(probes_per_stream) < 0.05
        probes = [ProbeRecord(id=i + 1, at=T0 + timedelta(seconds=5 * i), model="m", kind="production",
                              class_ref="a@r1", condition=1, prompt_id="p",
                              score=Score(match=not b, distance=0.0, diverged=bool(b)))
                  for i, b in enumerate(bad)]
        state = fold(StreamState(), probes, designs, T0, min_probes=s.canary_min_probes,
                     recovery_probes=s.canary_recovery_probes)
        assert state.verdict == "healthy" and state.divergence.alarmed_at is None, stream
        assert state.divergence.bad == int(bad.sum())
