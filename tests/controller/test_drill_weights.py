"""The pure parts of canary drills: the misrouted weights the routing table carries, and the drill
reconciler's expiry decision."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetctl.controller.drill_reconciler import DrillItem, DrillSnapshot, decide_expiry
from fleetctl.controller.drills import misrouted_weights

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_the_fraction_goes_to_the_target_and_the_rest_keeps_its_proportions() -> None:
    assert misrouted_weights({"a@r1": 1.0}, "b@r1", 0.15) == pytest.approx({"a@r1": 0.85, "b@r1": 0.15})
    assert misrouted_weights({"a@r1": 90, "b@r1": 10}, "b@r1", 0.2) == pytest.approx({"a@r1": 0.72, "b@r1": 0.28})
    assert misrouted_weights({"a@r1": 3, "c@r1": 1}, "b@r1", 0.5) == pytest.approx(
        {"a@r1": 0.375, "c@r1": 0.125, "b@r1": 0.5})


def test_zero_weights_stay_pinnable_and_no_weight_at_all_sends_everything_to_the_target() -> None:
    assert misrouted_weights({"a@r1": 2, "z@r1": 0}, "b@r1", 0.1) == pytest.approx({"a@r1": 0.9, "z@r1": 0.0, "b@r1": 0.1})
    assert misrouted_weights({"a@r1": 0}, "b@r1", 0.1) == {"a@r1": 0.0, "b@r1": 1.0}


@pytest.mark.parametrize("fraction", [-0.01, 1.01, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError):
        misrouted_weights({"a@r1": 1}, "b@r1", fraction)


weights = st.dictionaries(st.sampled_from(["a@r1", "a@r2", "b@r1", "c@r3"]),
                          st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1)


@given(weights, st.sampled_from(["a@r1", "b@r1", "d@r1"]), st.floats(min_value=0.001, max_value=0.5))
def test_the_target_gets_at_least_the_fraction_and_the_weights_sum_to_one(w: dict[str, float], to: str,
                                                                          fraction: float) -> None:
    out = misrouted_weights(w, to, fraction)
    assert set(out) == set(w) | {to}
    assert sum(out.values()) == pytest.approx(1.0)
    assert out[to] >= fraction - 1e-12 and all(v >= 0 for v in out.values())
    total = sum(v for v in w.values() if v > 0)
    if total > 0:
        for ref, weight in w.items():
            if ref != to:
                assert out[ref] == pytest.approx((1 - fraction) * (max(weight, 0) / total))  # the share first: a tiny weight does not underflow


def test_expiry_ends_the_drills_whose_time_is_up_and_requeues_at_the_next_end() -> None:
    snapshot = DrillSnapshot((DrillItem(1, "misroute", T0 + timedelta(seconds=60)),
                              DrillItem(2, "plant", T0 + timedelta(seconds=300)),
                              DrillItem(3, "plant", T0 + timedelta(seconds=90))))
    early = decide_expiry(snapshot, T0)
    assert (early.expire, early.requeue_after_s) == ((), 60.0)
    later = decide_expiry(snapshot, T0 + timedelta(seconds=90))
    assert (later.expire, later.requeue_after_s) == ((1, 3), 210.0)
    assert decide_expiry(snapshot, T0 + timedelta(hours=1)) == decide_expiry(snapshot, T0 + timedelta(hours=1))
    assert decide_expiry(snapshot, T0 + timedelta(hours=1)).requeue_after_s is None
    assert decide_expiry(DrillSnapshot(()), T0).expire == ()
