"""A P/D rollout keeps prefill and decode of one revision paired: A serves with a prefill and a decode engine;
B's come up together; while traffic is split, every request's prefill engine (`x-fleet-prefilled-by`) and
decode engine (`x-fleet-served-by`) run the same class revision, the one the request was routed to."""

from __future__ import annotations

import pytest
from rollout_api import make_steps, spec, start, wait_acknowledged_on, wait_phase
from rollout_fleet import READY_TIMEOUT_S, wait_until
from rollout_load import Load, describe

pytestmark = pytest.mark.slow


def test_pd_rollout_pairs_prefill_and_decode_of_one_revision(pd_fleet):
    fleet = pd_fleet
    a, b = fleet.current(), fleet.other()
    rollout = start(fleet, spec(b, make_steps("scale", 50, ("pause", None), 100)), reason="test: P/D")
    with Load(fleet.gateway_url, stream=False) as load:
        wait_phase(fleet, rollout["id"], "paused", timeout_s=READY_TIMEOUT_S, step_index=2)
        wait_acknowledged_on(fleet, {a: 50, b: 50})
        classes = fleet.engine_classes()
        assert sorted(e["role"] for e in fleet.engines() if e["class_ref"] == b) == ["decode", "prefill"]
        wait_until(lambda: sum(1 for o in load.snapshot() if o.prefilled_by and o.class_ref == b) >= 5
                   and sum(1 for o in load.snapshot() if o.prefilled_by and o.class_ref == a) >= 5, 90,
                   "P/D requests served by both revisions")
    outcomes = load.snapshot()
    assert load.failures() == [], describe(outcomes)
    handed_off = [o for o in outcomes if o.prefilled_by]
    pairs = {(classes.get(o.prefilled_by), classes.get(o.engine), o.class_ref) for o in handed_off}
    assert pairs == {(a, a, a), (b, b, b)}, pairs
    fleet.http("POST", f"/api/v1/rollouts/{rollout['id']}/promote", {"reason": "test: finish"})
    wait_phase(fleet, rollout["id"], "completed", timeout_s=60)
    wait_acknowledged_on(fleet, {b: 100})
