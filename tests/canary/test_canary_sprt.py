"""The truncated SPRT against the reference's worked table (Wald's bounds and expected sample sizes), and
its four outcomes."""

from __future__ import annotations

import pytest

from fleetctl.canary import sprt


@pytest.mark.parametrize(("p0", "p1", "alpha", "beta", "a", "b", "n_bad", "n_good"), [
    (0.05, 0.1925, 0.01, 0.05, 4.55, -2.99, 33, 33),
    (0.05, 0.1925, 0.001, 0.05, 6.86, -2.99, 50, 34),
    (0.02, 0.167, 0.01, 0.05, 4.55, -2.99, 19, 25),
    (0.10, 0.235, 0.01, 0.05, 4.55, -2.99, 55, 48),
])
def test_bounds_and_expected_samples_match_the_table(p0: float, p1: float, alpha: float, beta: float, a: float,
                                                     b: float, n_bad: int, n_good: int) -> None:
    bounds = sprt.bounds(alpha, beta)
    assert (round(bounds.accept_p1, 2), round(bounds.accept_p0, 2)) == (a, b)
    under_p1, under_p0 = sprt.expected_samples(p0, p1, alpha, beta)
    assert (round(under_p1), round(under_p0)) == (n_bad, n_good)


def test_the_four_outcomes() -> None:
    args = dict(p0=0.05, p1=0.1925, alpha=0.01, beta=0.05, cap=100)
    # each bad probe adds ln(0.1925/0.05) = 1.35, each good one ln(0.8075/0.95) = -0.1625
    assert sprt.sprt_decision(4, 4, **args) == "fail"  # 5.39 >= 4.55
    assert sprt.sprt_decision(3, 4, **args) == "continue"
    assert sprt.sprt_decision(0, 19, **args) == "pass"  # -3.09 <= -2.99
    assert sprt.sprt_decision(0, 18, **args) == "continue"
    assert sprt.sprt_decision(6, 40, **dict(args, cap=40)) == "inconclusive"  # 8.1 - 5.5: undecided at the cap
    assert sprt.sprt_decision(6, 40, **args) == "continue"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        sprt.sprt_decision(1, 10, 0.2, 0.1, 0.01, 0.05, 100)  # p1 below p0
    with pytest.raises(ValueError):
        sprt.sprt_decision(11, 10, 0.05, 0.2, 0.01, 0.05, 100)
    with pytest.raises(ValueError):
        sprt.bounds(0.6, 0.5)
