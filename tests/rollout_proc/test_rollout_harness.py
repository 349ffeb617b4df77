"""The rollout tests' fleet itself: A serves all the load through the gateway, every request answered."""

from __future__ import annotations

import pytest
from rollout_load import Load, describe

pytestmark = pytest.mark.slow


def test_fleet_serves_a_under_load(fleet):
    with Load(fleet.gateway_url) as load:
        load.wait_for(10)
    outcomes = load.snapshot()
    assert outcomes and all(o.ok for o in outcomes), describe(outcomes)
    assert {o.class_ref for o in outcomes} == {fleet.refs["A"]}
    assert all(o.ttft_s is not None and o.engine for o in outcomes)
    assert fleet.weights() == {fleet.refs["A"]: 100}
