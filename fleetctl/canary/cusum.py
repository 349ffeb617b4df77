"""The Bernoulli CUSUM that watches a stream of probe outcomes, with thresholds derived from a false-alarm
target rather than tuned by hand. Pure (numpy for the linear algebra only).

A stream's probes are good or bad (bad: the answer diverged from the reference, or the expected answer was
wrong). A stable build is already bad at some rate `p0` (its own noise); a broken one is bad at
`p1 = p0 + shift * (1 - p0)` (a `shift` of 0.15: 15 in 100 answers turned bad, e.g. a 15% misroute). The
CUSUM in count units (Reynolds & Stoumbos 1999) is `B = max(0, B + x - gamma)`, alarming at `B >= h_B`,
with `gamma` the log-likelihood-ratio balance point of p0 and p1. Rounding gamma to `1/m` puts B on a grid
of 1/m: a good probe moves it down one step (never below 0), a bad one up `m - 1` steps. On that grid the
mean number of probes to an alarm (the average run length, ARL) is exact from one linear system (Brook &
Evans 1972): with Q the transitions among the states below the threshold, `(I - Q) L = 1`, and the ARL from
a fresh start is `L[0]`. `design` picks the smallest threshold whose in-control ARL (ARL0, probes to a
false alarm) reaches the target; ARL1 is then the mean delay to detect p1 from the start.
"""

from __future__ import annotations

import math
from datetime import datetime
from functools import lru_cache

import numpy as np

from fleetctl.canary.types import CusumDesign, CusumState

MAX_H_STEPS = 1 << 14  # a threshold beyond this many grid steps means the target cannot be reached sensibly
MAX_P0 = 0.45  # above this the grid cannot give good probes a downward drift (1/m <= p0 for every m >= 2)


def target_arl0(false_alarm_days: float, interval_s: float) -> float:
    """Probes between false alarms for one false alarm per `false_alarm_days`, probing every `interval_s`."""
    return false_alarm_days * 86400.0 / interval_s


def shifted(p0: float, shift: float) -> float:
    """The bad rate when a fraction `shift` of the outcomes turns bad: p0 + shift (1 - p0)."""
    return p0 + shift * (1.0 - p0)


def gamma(p0: float, p1: float) -> float:
    """The reference value in count units: ln((1-p0)/(1-p1)) / ln(p1(1-p0) / (p0(1-p1)))."""
    return math.log((1 - p0) / (1 - p1)) / math.log(p1 * (1 - p0) / (p0 * (1 - p1)))


def grid(p0: float, p1: float) -> int:
    """m, with gamma rounded to 1/m. Kept above p0 (1/m > p0), so good probes still pull the statistic down
    under control; at least 2."""
    m = max(2, round(1.0 / gamma(p0, p1)))
    while m > 2 and 1.0 / m <= p0:
        m -= 1
    return m


def chain_arl(p: float, m: int, h_steps: int) -> float:
    """The exact zero-state ARL (probes to an alarm) when each probe is bad with probability `p`, on the grid
    of 1/m with the alarm at `h_steps` steps. (I - Q) has one subdiagonal (a good probe: one step down) and
    its upper band reaches m - 1 columns (a bad probe: m - 1 steps up); it is a nonsingular M-matrix, so
    banded elimination without pivoting is stable, and costs h_steps * m operations instead of h_steps^3."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1]: {p}")
    if m < 2 or h_steps < 1:
        raise ValueError(f"m must be >= 2 and h_steps >= 1: {m}, {h_steps}")
    if p == 0.0:
        return math.inf  # never a bad probe: never an alarm
    n, up = h_steps, m - 1
    # band[s, j] = (I - Q)[s, s + j] for j = 0..up; sub[s] = (I - Q)[s, s - 1]
    band = np.zeros((n, up + 1))
    band[:, 0] = 1.0
    band[0, 0] = p  # a good probe at 0 stays at 0
    for s in range(n):
        if s + up < n:
            band[s, up] = -p
    sub = np.full(n, -(1.0 - p))
    rhs = np.ones(n)
    for s in range(1, n):  # eliminate the subdiagonal entry of row s with row s - 1 (which starts at s - 1)
        factor = sub[s] / band[s - 1, 0]
        band[s, :up] -= factor * band[s - 1, 1:]
        rhs[s] -= factor * rhs[s - 1]
    arl = np.zeros(n)
    for s in range(n - 1, -1, -1):
        width = min(up, n - 1 - s)
        arl[s] = (rhs[s] - band[s, 1:width + 1] @ arl[s + 1:s + 1 + width]) / band[s, 0]
    return float(arl[0])


@lru_cache(maxsize=1024)
def design(p0: float, shift: float, target_arl0: float) -> CusumDesign:
    """The CUSUM for noise `p0` that detects `shift`, with the smallest threshold whose exact ARL0 reaches
    `target_arl0` (the ARL grows with the threshold: doubling brackets it, bisection finds it)."""
    if not 0.0 < p0 <= MAX_P0:
        raise ValueError(f"p0 must be in (0, {MAX_P0}]: {p0}")
    if not 0.0 < shift < 1.0:
        raise ValueError(f"shift must be in (0, 1): {shift}")
    p1 = shifted(p0, shift)
    m = grid(p0, p1)
    low, high = 0, 1  # chain_arl(p0, m, low) < target <= chain_arl(p0, m, high) once bracketed
    while chain_arl(p0, m, high) < target_arl0:
        low, high = high, high * 2
        if high > MAX_H_STEPS:
            raise ValueError(f"no threshold within {MAX_H_STEPS} steps reaches ARL0 {target_arl0:g} at p0 {p0}")
    while high - low > 1:
        mid = (low + high) // 2
        if chain_arl(p0, m, mid) >= target_arl0:
            high = mid
        else:
            low = mid
    return CusumDesign(p0=p0, p1=p1, m=m, h_steps=high, arl0=chain_arl(p0, m, high), arl1=chain_arl(p1, m, high),
                       target_arl0=target_arl0)


def threshold(design: CusumDesign) -> float:
    """h_B: the threshold in count units."""
    return design.h_steps / design.m


def statistic(state: CusumState, design: CusumDesign) -> float:
    """B in count units (compare with `threshold`)."""
    return state.steps / design.m


def alarming(state: CusumState, design: CusumDesign) -> bool:
    """The last probe took the statistic to the threshold."""
    return state.steps >= design.h_steps


def update(state: CusumState, bad: bool, design: CusumDesign, now: datetime) -> CusumState:
    """One probe. After an alarm the statistic restarts at 0 (it stays at the threshold until the next probe,
    so the evidence shows what crossed); `alarmed_at` is set when this probe reaches the threshold."""
    start = 0 if alarming(state, design) else state.steps
    steps = start + design.m - 1 if bad else max(start - 1, 0)
    alarmed = steps >= design.h_steps
    return CusumState(steps=steps, probes=state.probes + 1, bad=state.bad + int(bad),
                      alarmed_at=now if alarmed else state.alarmed_at)


def regrid(state: CusumState, old_m: int, new_m: int) -> CusumState:
    """The same statistic (in count units) on another grid: when a stream's noise bound, and so its design,
    changes, the evidence gathered so far is kept rather than thrown away."""
    if old_m == new_m:
        return state
    return state.model_copy(update={"steps": round(state.steps * new_m / old_m)})


def alarm_probability(p: float, m: int, h_steps: int, probes: int) -> float:
    """The chance of at least one alarm within `probes` probes from a fresh start, each bad with
    probability `p`: the run-length distribution, by pushing the state distribution through the chain."""
    states = np.zeros(h_steps)
    states[0] = 1.0
    alarmed = 0.0
    for _ in range(probes):
        moved = np.zeros(h_steps)
        moved[0] += (1.0 - p) * states[0]
        moved[:-1] += (1.0 - p) * states[1:]  # a good probe: one step down
        up = m - 1
        moved[up:] += p * states[:h_steps - up] if up < h_steps else 0.0  # a bad one: m - 1 steps up
        alarmed += p * states[max(h_steps - up, 0):].sum()
        states = moved
    return float(alarmed)
