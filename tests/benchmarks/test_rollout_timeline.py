"""The rollout benchmark's arithmetic: when every gateway routes on a split (from sampled tables and
gateway generations), what a request's outcome counts as, and what a spec asks to wait."""

from __future__ import annotations

import pytest

from benchmarks.rollout import detection_bound_s, nominal_waits_s, regression_spec, rollout_spec, trial_spec
from benchmarks.rollout_timeline import GatewaySample, TableSample, applied_at, first_generation, only_on, share_of
from benchmarks.rollout_traffic import Result

A, B = "chat@r1", "chat@r2"
TABLES = [
    TableSample(1.0, 5, {A: 90, B: 10}),
    TableSample(2.0, 6, {A: 100, B: 0}),
    TableSample(3.0, 7, {A: 100}),
]


def test_first_generation_is_the_first_sampled_table_that_holds_after_the_moment():
    assert first_generation(TABLES, 0.0, share_of(B, 10)) == 5
    assert first_generation(TABLES, 0.0, share_of(B, 50)) is None
    assert first_generation(TABLES, 0.0, only_on(A)) == 6
    assert first_generation(TABLES, 2.5, only_on(A)) == 7
    assert first_generation(TABLES, 0.0, only_on(B)) is None


def test_applied_at_waits_for_the_last_gateway():
    samples = [GatewaySample(1.5, "g1", 5), GatewaySample(2.1, "g1", 6), GatewaySample(2.2, "g2", 5),
               GatewaySample(2.6, "g2", 7), GatewaySample(2.9, "g1", 7)]
    assert applied_at(samples, ["g1", "g2"], 6, since=2.0) == pytest.approx(2.6)
    assert applied_at(samples, ["g1"], 6, since=2.0) == pytest.approx(2.1)
    assert applied_at(samples, ["g1", "g2", "g3"], 6, since=2.0) is None  # g3 never reported
    assert applied_at(samples, ["g1", "g2"], 8, since=0.0) is None


def test_a_result_is_failed_cut_or_complete():
    def result(**kw) -> Result:
        return Result(0, "g", 0.0, **{"status": 200, "tokens": 3, "completion_tokens": 4, "finish_reason": "length",
                                      "done": True, "expected": 4, **kw})

    assert not result().failed and not result().cut  # 4 tokens, one of them without text of its own
    assert result(completion_tokens=3).cut
    assert result(done=False).cut
    assert result(finish_reason=None).cut
    assert result(status=503).failed and not result(status=503).cut
    assert result(error="in-band").failed


def test_spec_waits_and_detection_bound():
    spec = rollout_spec("chat", B, [10, 25, 50, 100], pause_s=20, interval_s=10)
    kinds = [next(iter(step)) for step in spec["steps"]]
    assert kinds == ["scale", "setWeight", "pause", "setWeight", "pause", "setWeight", "analysis", "setWeight"]
    assert nominal_waits_s(spec) == 20 + 20 + 10
    assert nominal_waits_s(trial_spec("chat", A)) == 0  # its pause waits for an operator
    assert detection_bound_s(regression_spec("chat", B, interval_s=6)) == 6
