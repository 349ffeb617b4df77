"""The arrival-rate prediction and the choice and order of flips."""

from __future__ import annotations

import pytest

from fleetctl.pd.flips import EngineNow, TargetRefused, check_target, next_flip, preview
from fleetctl.pd.planner import Ratio
from fleetctl.pd.predict import RateSample, predict


def test_a_steady_rate_predicts_itself_and_noise_is_damped() -> None:
    steady = [RateSample(10.0 * i, 5.0) for i in range(20)]
    assert predict(steady, 60).rps == pytest.approx(5.0)
    noisy = [RateSample(10.0 * i, 5.0 + (3.0 if i % 2 else -3.0)) for i in range(30)]
    assert abs(predict(noisy, 60).rps - 5.0) < 1.5  # a sample alone swings by 3


def test_a_ramp_is_seen_coming() -> None:
    ramp = [RateSample(10.0 * i, 1.0 + 0.1 * i) for i in range(30)]  # +0.01 req/s per second
    prediction = predict(ramp, 60)
    assert prediction.rps > ramp[-1].rps and prediction.trend_rps_per_s > 0


def test_too_few_samples_fall_back_to_the_last_rate_and_none_to_zero() -> None:
    assert predict([RateSample(0, 3.0), RateSample(10, 4.0)], 60).rps == 4.0
    assert predict([], 60).rps == 0.0
    assert predict([RateSample(10.0 * i, 10.0 - i) for i in range(12)], 600).rps == 0.0  # never negative


def engines() -> list[EngineNow]:
    return [EngineNow("p-0", "prefill", True, 3, 0.5), EngineNow("d-0", "decode", True, 5, 0.2),
            EngineNow("d-1", "decode", True, 1, 0.1), EngineNow("d-2", "decode", False), EngineNow("d-3", "decode", True, 1, 0.0)]


def test_the_cheapest_engine_flips_first_not_serving_before_idle() -> None:
    flips = preview(engines(), Ratio(1, 4), Ratio(3, 2))
    assert [(f.engine, f.from_role, f.to_role) for f in flips] == [("d-2", "decode", "prefill"),
                                                                   ("d-3", "decode", "prefill")]


def test_into_pd_from_mixed_the_empty_role_comes_first() -> None:
    mixed = [EngineNow(f"m-{i}", "mixed", True, i) for i in range(4)]
    flips = preview(mixed, Ratio(0, 0, 4), Ratio(1, 3, 0))
    assert [f.to_role for f in flips][:2] in (["prefill", "decode"], ["decode", "prefill"])
    assert len(flips) == 4 and {f.to_role for f in flips[:2]} == {"prefill", "decode"}


def test_nothing_to_flip_at_the_target() -> None:
    assert next_flip(engines(), Ratio(1, 4), Ratio(1, 4)) is None


@pytest.mark.parametrize("target, field", [
    (Ratio(0, 4), "prefill"), (Ratio(4, 0), "decode"), (Ratio(2, 2, 1), "prefill"), (Ratio(-1, 5), "prefill"),
])
def test_bad_targets_are_refused_naming_the_role(target: Ratio, field: str) -> None:
    with pytest.raises(TargetRefused) as refused:
        check_target(Ratio(1, 3), target, 1, 1)
    assert refused.value.field == field


def test_back_to_mixed_only_is_a_target() -> None:
    check_target(Ratio(1, 3), Ratio(0, 0, 4), 1, 1)
