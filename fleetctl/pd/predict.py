"""The arrival rate the planner plans for: Holt's linear smoothing (level and trend) over rate samples,
projected one horizon ahead.

Why not the instantaneous rate: a flip takes tens of seconds to a minute (drain, restart, warm-up), so a
planner acting on the rate it sees now reacts to a burst that is over by the time the flip lands, and the
two pipelined stages make that an oscillator (Mooncake's lesson). Smoothing damps the noise; the trend term
still sees a real ramp coming. Until there are `MIN_SAMPLES` samples the prediction is the last rate seen
(Dynamo's planner falls back to "constant" the same way while it warms up). Pure: samples in, a number out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_SAMPLES = 3
ALPHA = 0.3  # weight of a new sample in the level
BETA = 0.1  # weight of a new slope in the trend


@dataclass(frozen=True)
class RateSample:
    at_s: float  # seconds on any monotonic clock
    rps: float  # requests per second measured over the window that ended at `at_s`


@dataclass(frozen=True)
class Prediction:
    rps: float  # what to plan for
    measured_rps: float  # the last sample, for display
    trend_rps_per_s: float
    samples: int


def predict(samples: Sequence[RateSample], horizon_s: float) -> Prediction:
    """The rate `horizon_s` after the last sample; never negative. No samples: 0."""
    if not samples:
        return Prediction(0.0, 0.0, 0.0, 0)
    ordered = sorted(samples, key=lambda s: s.at_s)
    last = ordered[-1].rps
    if len(ordered) < MIN_SAMPLES:
        return Prediction(last, last, 0.0, len(ordered))
    level, trend = ordered[0].rps, 0.0
    for previous, sample in zip(ordered, ordered[1:]):
        dt = max(sample.at_s - previous.at_s, 1e-9)
        projected = level + trend * dt
        new_level = ALPHA * sample.rps + (1 - ALPHA) * projected
        trend = BETA * (new_level - level) / dt + (1 - BETA) * trend
        level = new_level
    return Prediction(max(level + trend * horizon_s, 0.0), last, trend, len(ordered))
