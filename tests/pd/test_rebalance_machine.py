"""The role-flip machine, step by step on fixed observations: one flip at a time, a drain waits for the
engine to be gone, the SLO judgement stops at a whole ratio, holds, and crash-safety of re-emitted actions."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from fleetctl.controller.rebalance import machine
from fleetctl.controller.rebalance.state import (
    DrainEngine, Observations, RebalanceSpec, RebalanceState, Record, ScaleRole,
)
from fleetctl.controller.rollout.state import Histogram, ServedCounters
from fleetctl.pd.flips import EngineNow
from fleetctl.pd.planner import Ratio

T0 = datetime(2026, 12, 3, tzinfo=timezone.utc)
REF = "chat@r1"
BOUNDS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
SPEC = RebalanceSpec("m", REF, Ratio(2, 2), ttft_slo_s=1.0, itl_slo_s=0.1, baseline_s=0, min_requests=10)


def served(requests: int, ttft_at: float) -> dict:
    """One gateway's counters: `requests` requests, all with TTFT in the bucket of `ttft_at`, ITL 0.05 s."""
    counts = tuple(requests if bound >= ttft_at else 0 for bound in BOUNDS)
    itl = tuple(requests for _ in BOUNDS)
    return {"gw": {REF: ServedCounters(requests, 0, 0, Histogram(BOUNDS, counts, requests, requests * ttft_at),
                                       Histogram(BOUNDS, itl, requests, requests * 0.05))}}


def obs(**changes) -> Observations:
    base = Observations(
        engines=(EngineNow("p-0", "prefill", True, 2, 0.1, deployment="chat-prefill"),
                 EngineNow("d-0", "decode", True, 4, 0.3, deployment="chat-decode"),
                 EngineNow("d-1", "decode", True, 0, 0.0, deployment="chat-decode"),
                 EngineNow("d-2", "decode", True, 3, 0.2, deployment="chat-decode")),
        running=frozenset({"p-0", "d-0", "d-1", "d-2"}), drained=frozenset(),
        desired=Ratio(1, 3), ready=Ratio(1, 3), replicas={"chat-prefill": 1, "chat-decode": 3},
        acknowledged=True, served=served(100, 0.3))
    return replace(base, **changes)


def started() -> RebalanceState:
    first = machine.step(SPEC, RebalanceState(), obs(), T0)
    assert [type(a) for a in first.actions] == [Record, Record, DrainEngine, Record]
    return first.state


def test_the_first_flip_drains_the_cheapest_engine_and_shrinks_its_deployment() -> None:
    state = started()
    (flip,) = state.flips
    assert (flip.engine, flip.from_role, flip.to_role, flip.phase) == ("d-1", "decode", "prefill", "draining")
    again = machine.step(SPEC, state, obs(drained=frozenset({"d-1"}), replicas={"chat-prefill": 1, "chat-decode": 2},
                                          desired=Ratio(1, 2)), T0 + timedelta(seconds=1))
    assert again.actions == () and again.state.flips == state.flips  # draining: wait, nothing new


def test_a_drain_lost_in_a_crash_is_emitted_again() -> None:
    state = started()
    again = machine.step(SPEC, state, obs(), T0 + timedelta(seconds=1))  # the fleet shows no drain
    assert again.actions == (DrainEngine("d-1", "chat-decode", 2),)


def test_the_new_role_is_scaled_only_once_the_engine_is_gone_then_waits_for_ready_and_routing() -> None:
    state = started()
    gone = obs(engines=tuple(e for e in obs().engines if e.name != "d-1"), running=frozenset({"p-0", "d-0", "d-2"}),
               desired=Ratio(1, 2), ready=Ratio(1, 2), replicas={"chat-prefill": 1, "chat-decode": 2})
    scaling = machine.step(SPEC, state, gone, T0 + timedelta(seconds=5))
    assert scaling.actions[0] == ScaleRole("prefill", 2, "chat-decode")
    state = scaling.state
    asked = replace(gone, desired=Ratio(2, 2), replicas={"chat-prefill": 2, "chat-decode": 2})
    waiting = machine.step(SPEC, state, asked, T0 + timedelta(seconds=6))
    assert waiting.actions == ()  # the new engine is not ready yet
    unrouted = machine.step(SPEC, state, replace(asked, ready=Ratio(2, 2), acknowledged=False), T0 + timedelta(seconds=7))
    assert unrouted.actions == ()  # ready, but a gateway does not route to it yet
    done = machine.step(SPEC, state, replace(asked, ready=Ratio(2, 2), served=served(200, 0.3)), T0 + timedelta(seconds=8))
    assert done.state.phase == "completed" and [r.event for r in done.actions] == ["flip_done", "completed"]


def test_a_flip_that_worsens_ttft_past_the_slo_stops_at_a_whole_ratio() -> None:
    spec = replace(SPEC, target=Ratio(3, 1))
    state = machine.step(spec, RebalanceState(), obs(), T0).state
    gone = obs(engines=tuple(e for e in obs().engines if e.name != "d-1"), running=frozenset({"p-0", "d-0", "d-2"}),
               desired=Ratio(1, 2), ready=Ratio(1, 2), replicas={"chat-prefill": 1, "chat-decode": 2})
    state = machine.step(spec, state, gone, T0 + timedelta(seconds=5)).state
    worse = replace(gone, desired=Ratio(2, 2), ready=Ratio(2, 2), replicas={"chat-prefill": 2, "chat-decode": 2},
                    served={"gw": {REF: _sum(served(100, 0.3)["gw"][REF], served(50, 4.0)["gw"][REF])}})
    stopped = machine.step(spec, state, worse, T0 + timedelta(seconds=9))
    assert stopped.state.phase == "stopped"
    assert "TTFT p90" in stopped.state.message and "> SLO 1 s" in stopped.state.message
    assert not any(isinstance(a, DrainEngine) for a in stopped.actions)  # no second flip begins


def test_a_freeze_or_a_rollout_holds_it_and_it_resumes_by_itself() -> None:
    state = started()
    held = machine.step(SPEC, state, obs(frozen=True), T0 + timedelta(seconds=1))
    assert held.state.paused_by == "freeze" and [a.event for a in held.actions] == ["paused"]
    still = machine.step(SPEC, held.state, obs(frozen=True), T0 + timedelta(seconds=2))
    assert still.actions == ()
    rollout = machine.step(SPEC, held.state, obs(rollout="rollout 7"), T0 + timedelta(seconds=3))
    assert rollout.state.paused_by == "rollout"
    resumed = machine.step(SPEC, rollout.state, obs(), T0 + timedelta(seconds=4))
    assert resumed.state.paused_by is None and resumed.actions[0].event == "resumed"


def test_an_engine_already_flipped_is_never_picked_again() -> None:
    state = started()
    flipped = state.flips[0].engine
    done = replace(state, flips=(replace(state.flips[0], phase="done"),))
    # the fleet still shows the old engine (a stale read): the machine must not pick it a second time
    nxt = machine.step(replace(SPEC, target=Ratio(3, 1)), done, obs(desired=Ratio(2, 2)), T0 + timedelta(seconds=9))
    drains = [a for a in nxt.actions if isinstance(a, DrainEngine)]
    assert drains and all(a.engine != flipped for a in drains)


def test_the_state_survives_its_json_form() -> None:
    state = started()
    assert RebalanceState.from_json(state.to_json()) == state
    assert RebalanceSpec.from_json(SPEC.to_json()) == SPEC


def _sum(a: ServedCounters, b: ServedCounters) -> ServedCounters:
    from fleetctl.controller.rollout.window import add_counters
    return add_counters(a, b)
