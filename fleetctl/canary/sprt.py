"""Wald's sequential probability ratio test, truncated: a one-shot pass/fail decision over a batch of probe
outcomes (for example B's probes during one rollout step), where the CUSUM (cusum.py) watches a stream
forever. Pure.

The log-likelihood ratio of `bad` bad outcomes in `total`, bad rate p1 against p0, is
`L = bad ln(p1/p0) + (total - bad) ln((1-p1)/(1-p0))`. Crossing `A = ln((1-beta)/alpha)` accepts p1 (fail);
crossing `B = ln(beta/(1-alpha))` accepts p0 (pass); `alpha` is the chance of failing a good build, `beta`
of passing a bad one. Without a decision by `cap` outcomes the answer is inconclusive (a rollout pauses;
it never passes for lack of data). The expected sample sizes (Wald's approximations) are about half what a
fixed-size binomial test of the same error rates needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

SprtDecision = Literal["fail", "pass", "continue", "inconclusive"]


@dataclass(frozen=True)
class SprtBounds:
    accept_p1: float  # A: fail at or above
    accept_p0: float  # B: pass at or below


def bounds(alpha: float, beta: float) -> SprtBounds:
    if not (0.0 < alpha < 1.0 and 0.0 < beta < 1.0 and alpha + beta < 1.0):
        raise ValueError(f"alpha and beta must be in (0, 1) with alpha + beta < 1: {alpha}, {beta}")
    return SprtBounds(math.log((1 - beta) / alpha), math.log(beta / (1 - alpha)))


def log_likelihood_ratio(bad: int, total: int, p0: float, p1: float) -> float:
    _check_rates(p0, p1)
    if not 0 <= bad <= total:
        raise ValueError(f"need 0 <= bad <= total: {bad}, {total}")
    return bad * math.log(p1 / p0) + (total - bad) * math.log((1 - p1) / (1 - p0))


def sprt_decision(bad: int, total: int, p0: float, p1: float, alpha: float, beta: float, cap: int) -> SprtDecision:
    """fail (bad rate p1), pass (p0), continue (probe more), or inconclusive (`cap` outcomes, no decision)."""
    b = bounds(alpha, beta)
    llr = log_likelihood_ratio(bad, total, p0, p1)
    if llr >= b.accept_p1:
        return "fail"
    if llr <= b.accept_p0:
        return "pass"
    return "inconclusive" if total >= cap else "continue"


def expected_samples(p0: float, p1: float, alpha: float, beta: float) -> tuple[float, float]:
    """Wald's approximate mean number of outcomes to a decision: (under p1, under p0)."""
    _check_rates(p0, p1)
    b = bounds(alpha, beta)
    i1, i0 = _kl(p1, p0), _kl(p0, p1)
    under_p1 = ((1 - beta) * b.accept_p1 + beta * b.accept_p0) / i1
    under_p0 = ((1 - alpha) * b.accept_p0 + alpha * b.accept_p1) / -i0
    return under_p1, under_p0


def _kl(p: float, q: float) -> float:
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


def _check_rates(p0: float, p1: float) -> None:
    if not 0.0 < p0 < p1 < 1.0:
        raise ValueError(f"need 0 < p0 < p1 < 1: {p0}, {p1}")
