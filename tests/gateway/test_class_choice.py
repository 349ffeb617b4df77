"""choose_class: weights decide, a pin overrides; fits: refuse a context window that cannot hold the request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.gateway.class_choice import choose_class, fits
from fleetctl.gateway.errors import InvalidRoute, NoRoute
from fleetctl.replica_class import ReplicaClassSpec

GRID = 10_000


def picks(weights: dict[str, float]) -> dict[str, int]:
    counts = {ref: 0 for ref in weights}
    for i in range(GRID):
        counts[choose_class(weights, None, i / GRID)] += 1
    return counts


def test_weights_decide_the_split():
    assert picks({"chat@r1": 90, "chat@r2": 10, "chat@r3": 0}) == {"chat@r1": 9000, "chat@r2": 1000, "chat@r3": 0}


def test_a_pin_overrides_the_weights_even_at_zero_weight():
    weights = {"chat@r1": 1.0, "chat@r2": 0.0}
    assert choose_class(weights, "chat@r2", 0.3) == "chat@r2"
    with pytest.raises(InvalidRoute) as err:
        choose_class(weights, "chat@r9", 0.3)
    assert err.value.param == "x-fleet-pin-class" and err.value.status_code == 400


def test_no_weight_anywhere_is_no_route_and_a_bad_draw_is_refused():
    with pytest.raises(NoRoute):
        choose_class({"chat@r1": 0.0}, None, 0.5)
    with pytest.raises(ValueError):
        choose_class({"chat@r1": 1.0}, None, 1.0)


weight_maps = st.dictionaries(
    st.sampled_from([f"chat@r{i}" for i in range(1, 6)]), st.floats(0.0, 100.0), min_size=1
).filter(lambda w: sum(w.values()) > 0)


@settings(max_examples=100, deadline=None)
@given(weight_maps)
def test_each_class_gets_its_weight_share_and_zero_weight_gets_none(weights):
    counts = picks(weights)
    total = sum(weights.values())
    for ref, weight in weights.items():
        assert abs(counts[ref] / GRID - weight / total) <= 1 / GRID + 1e-9
        if weight == 0:
            assert counts[ref] == 0


SPEC = ReplicaClassSpec(model="smollm2-135m", weights="tiny", max_model_len=2048)


def test_fits_accepts_an_exact_fit_and_refuses_one_token_more_with_the_reason():
    assert fits(2000, 48, SPEC) is None
    reason = fits(2000, 49, SPEC)
    assert reason == "prompt of 2000 tokens + max_tokens 49 = 2049 exceeds the context window of 2048 tokens"


def test_fits_without_max_tokens_needs_room_for_one_token():
    assert fits(2047, None, SPEC) is None
    assert "no room to generate" in fits(2048, None, SPEC)
