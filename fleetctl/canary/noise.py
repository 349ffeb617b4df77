"""A stream's in-control bad rate p0, from the reference's own recorded noise. Pure.

When the reference was recorded, each prompt was run several times at each batch condition and the runs
whose tokens differed from the reference were counted (types.ConditionNoise). The tests need p0 before any
probe is scored, and an underestimate would make them alarm too often, so p0 is an upper 95% confidence
bound (Clopper-Pearson, one-sided) on `diverged / runs` summed over the prompts, and never below the golden
set's `p0_floor` (however clean the recorded runs, a few are not proof of zero noise):

- a pinned stream at batch condition c uses the runs recorded at c; a condition nobody recorded borrows the
  runs at every condition (the class's noise in general);
- the production stream (condition None) pools every condition: its probes land at whatever batch the
  fleet is running;
- the answer test counts only prompts whose reference answer passed its expected check. Its p0 is the same
  bound over those prompts' runs: a greedy answer can only turn wrong if its tokens change, so the rate of
  changed runs bounds the rate of wrong answers from above. It is conservative (most changed tokens leave
  the answer right), which is the safe side for a false-alarm target.

A reference with no runs at all says nothing about its noise: p0 is then MAX_P0, the most tolerant design
the grid allows. Every bound is capped at MAX_P0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from fleetctl.canary.cusum import MAX_P0
from fleetctl.canary.types import ConditionNoise, PromptReference, Reference

CONFIDENCE = 0.95


def stream_p0(reference: Reference, condition: int | None, p0_floor: float) -> float:
    """p0 of the divergence test of a stream at `condition` (None: the production stream)."""
    return _bounded(reference.prompts.values(), condition, p0_floor)


def answer_p0(reference: Reference, condition: int | None, p0_floor: float) -> float | None:
    """p0 of the answer test; None when no prompt takes part in it (no reference answer passed its check)."""
    prompts = [p for p in reference.prompts.values() if p.expected_pass is True]
    return _bounded(prompts, condition, p0_floor) if prompts else None


def _bounded(prompts: Iterable[PromptReference], condition: int | None, p0_floor: float) -> float:
    prompts = list(prompts)
    runs, diverged = _count(prompts, condition)
    if runs == 0 and condition is not None:
        runs, diverged = _count(prompts, None)
    if runs == 0:
        return MAX_P0
    return min(max(upper_bound(diverged, runs, CONFIDENCE), p0_floor), MAX_P0)


def _count(prompts: Iterable[PromptReference], condition: int | None) -> tuple[int, int]:
    noises: list[ConditionNoise] = []
    for prompt in prompts:
        if condition is None:
            noises.extend(prompt.noise.values())
        elif condition in prompt.noise:
            noises.append(prompt.noise[condition])
    return sum(n.runs for n in noises), sum(min(n.diverged, n.runs) for n in noises)


def upper_bound(successes: int, trials: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided Clopper-Pearson upper bound: the p at which seeing `successes` or fewer in `trials` has
    probability 1 - confidence. 1.0 when every trial succeeded."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, trials > 0: {successes}, {trials}")
    if successes == trials:
        return 1.0
    tail = 1.0 - confidence
    if successes == 0:
        return 1.0 - tail ** (1.0 / trials)  # closed form: (1 - p)^n = tail
    low, high = successes / trials, 1.0
    for _ in range(60):  # P(X <= successes; p) falls as p grows: bisect for it to equal the tail
        mid = (low + high) / 2
        if binomial_cdf(successes, trials, mid) > tail:
            low = mid
        else:
            high = mid
    return high


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n may be thousands)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))
