"""`canary record` says when its runs bound the noise far above the golden set's floor."""

from __future__ import annotations

from fleetctl.canary.noise import upper_bound
from fleetctl.cli.canary_record import describe_report, p0_warning, runs_for_p0

BASE = {"id": 3, "model": "m", "class_ref": "c@r1", "golden_set": "g", "golden_version": 1, "prompts": 11,
        "noise": {"1": {"diverged": 0, "runs": 22, "max_distance": 0.0}}, "expected_pass": [], "expected_fail": [],
        "p0_floor": 0.01, "runs_for_tight_p0": runs_for_p0(0.02)}


def test_the_runs_needed_follow_the_rule_of_three() -> None:
    n = runs_for_p0(0.02)
    assert upper_bound(0, n) <= 0.02 < upper_bound(0, n - 1)
    assert 140 <= n <= 155  # about 3 / 0.02


def test_a_loose_bound_is_warned_about_with_the_runs_that_would_tighten_it() -> None:
    report = {**BASE, "p0": 0.128}
    warning = p0_warning(report)
    assert warning is not None and "p0 0.128" in warning and f"About {runs_for_p0(0.02)} runs" in warning
    assert describe_report(report).splitlines()[-1] == warning


def test_a_bound_near_the_floor_is_not() -> None:
    assert p0_warning({**BASE, "p0": 0.017}) is None
    assert "warning" not in describe_report({**BASE, "p0": 0.017})
