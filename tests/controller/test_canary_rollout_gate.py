"""The rollout gate reads the canary: a rollout whose analysis measures `quality` goes on while B's pinned
stream is healthy and aborts, restoring A, once B's stream drifts. Driven by the runtime's `step()` with a
simulated agent and gateway (rollout_helpers), and canary_probes rows stored as the probe executor stores
them (canary_store_helpers), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from canary_store_helpers import add_probes, store_reference
from ctl_helpers import Api
from rollout_helpers import R1, R2, Agent, Gateway, history, replicas, served_by_r1, show, spec, start, weights

from fleetctl.controller import canary_streams
from fleetctl.controller.models import CanaryEvent

B_DEPLOYMENT = "chat-chat-r2"
GATED = spec(
    steps=[{"scale": {}}, {"setWeight": 50}, {"pause": {"duration": "10m"}}, {"setWeight": 100}],
    analysis={"templates": ["golden"], "startingStep": 1},
    templates={"golden": {"metrics": [{"name": "q", "measure": "quality", "successCondition": "result >= 1",
                                       "interval": "5s", "failureLimit": 0, "consecutiveErrorLimit": 100}]}},
)


def tick(api: Api, agent: Agent, gateway: Gateway) -> dict[str, Any]:
    api.clock.advance(1)
    api.reconcile()
    agent.settle()
    gateway.refresh()
    api.reconcile()
    return show(api, 1)


def run_until(api: Api, agent: Agent, gateway: Gateway, done: Callable[[dict[str, Any]], bool], limit: int = 60) -> dict[str, Any]:
    for _ in range(limit):
        view = tick(api, agent, gateway)
        if done(view):
            return view
    raise AssertionError(f"not reached in {limit} ticks: {view['phase']} at step {view['step_index']}, {view['message']}")


def canary_events(api: Api, class_ref: str) -> list[dict[str, Any]]:
    with api.runtime.store.session() as session:
        rows = session.query(CanaryEvent).filter(CanaryEvent.class_ref == class_ref).order_by(CanaryEvent.id)
        return [{"verdict_from": r.verdict_from, "verdict_to": r.verdict_to} for r in rows]


def quality(api: Api) -> dict[str, str | None]:
    with api.runtime.store.session() as session:
        return canary_streams.quality(session, "smollm2-135m", [R1, R2])


def test_a_rollout_gated_on_quality_aborts_when_b_drifts_and_restores_a(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    ref = store_reference(api, R1)
    add_probes(api, ref, R1, 12)
    api.reconcile()
    assert quality(api) == {R1: "pass", R2: None}  # B is not deployed yet: not measured, never a pass
    assert start(api, GATED).status_code == 201

    run_until(api, agent, gateway, lambda v: replicas(api).get(B_DEPLOYMENT) == 1)
    add_probes(api, ref, R2, 12)  # B compared with A's reference: the same tokens
    view = run_until(api, agent, gateway, lambda v: v["phase"] == "paused" and v["step_index"] == 2)
    assert quality(api)[R2] == "pass" and weights(api)[R2] == 50.0

    add_probes(api, ref, R2, 6, diverged=True)  # B's answers turn: its batch-1 stream drifts
    aborted = run_until(api, agent, gateway, lambda v: v["phase"] == "aborted")
    assert "golden/q Failed: quality 0 not >= 1" in aborted["abort_reason"]
    assert {ref_: w for ref_, w in weights(api).items() if w > 0} == {R1: 100.0}
    assert replicas(api) == {"chat": 1, B_DEPLOYMENT: 0}
    assert "aborted" in history(api, 1) and view["phase"] == "paused"
    # B's stream drifted (the alert), then went unmeasured once B was drained: not a pass either way
    assert [(e["verdict_from"], e["verdict_to"]) for e in canary_events(api, R2)] == [
        ("not_measured", "healthy"), ("healthy", "drifting"), ("drifting", "not_measured")]
    assert quality(api)[R2] is None
