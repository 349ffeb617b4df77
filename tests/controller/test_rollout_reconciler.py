"""The rollout reconciler, driven by hand: the runtime's `step()` under an injected clock, a simulated agent
(heartbeats reporting assigned engines ready) and a simulated gateway (routing-table refreshes and reports),
on SQLite and PostgreSQL. A whole rollout; a pause that waits its time; a gateway that does not acknowledge
holds the rollout; abort, retry and undo; promote past an indefinite pause; and a second runtime on the
same database continuing a rollout from the step the first one left it at."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ctl_helpers import Api, Clock
from fastapi.testclient import TestClient
from rollout_helpers import (
    MODEL, R1, R2, Agent, Gateway, audit_actions, command, history, replicas, served_by_r1, show, spec, start, tick,
    weights,
)

from fleetctl.controller.api.app import create_app
from fleetctl.controller.rollout_reconciler import managed_name
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens

B_DEPLOYMENT = "chat-chat-r2"


def run_until(api: Api, agent: Agent, gateway: Gateway | None, done: Callable[[dict[str, Any]], bool],
              limit: int = 40, seconds: float = 1.0) -> list[dict[str, Any]]:
    seen = []
    for _ in range(limit):
        view = tick(api, agent, gateway, seconds)
        seen.append(view)
        if done(view):
            return seen
    raise AssertionError(f"not reached in {limit} ticks: {seen[-1]['phase']} at step {seen[-1]['step_index']}, "
                         f"{seen[-1]['message']}")


def share_of_b(view: dict[str, Any]) -> float:
    total = sum(view["weights"].values())
    return view["weights"].get(R2, 0.0) / total if total else 0.0


def test_a_whole_rollout_moves_traffic_step_by_step_and_drains_a(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    assert start(api, spec()).status_code == 201
    seen = run_until(api, agent, gateway, lambda v: v["phase"] == "completed")
    assert managed_name("chat", R2) == B_DEPLOYMENT
    assert replicas(api) == {"chat": 0, B_DEPLOYMENT: 1}  # B scaled like A; A drained at the end
    assert {ref: w for ref, w in weights(api).items() if w > 0} == {R2: 100.0}
    shares = [share_of_b(v) for v in seen]
    assert 0.5 in shares and shares.index(0.5) < shares.index(1.0)  # 50% before 100%, never back
    assert shares == sorted(shares)
    at_half = next(i for i, v in enumerate(seen) if share_of_b(v) == 0.5 and v["step_index"] == 2)
    full = shares.index(1.0)
    assert full - at_half >= 10  # the 10 s pause, at one second a tick
    final = seen[-1]
    assert final["progress"] == 1.0 and [s["status"] for s in final["steps"]] == ["done"] * 4
    events = history(api, 1)
    assert events[0] == "started" and events[-1] == "completed" and events.count("step_done") == 4
    actions = audit_actions(api)
    assert ("rollout.set_weights", "ok", None) in actions and ("rollout.scale_up", "ok", None) in actions
    assert ("rollout.drain", "ok", None) in actions and ("rollout.completed", "ok", None) in actions
    assert api.call("GET", "/api/v1/rollouts", role="viewer", params={"active": True}).json() == []


def test_a_gateway_that_does_not_acknowledge_holds_the_step(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    start(api, spec())
    run_until(api, agent, gateway, lambda v: share_of_b(v) == 0.5)
    stuck = [tick(api, agent, None) for _ in range(4)]  # the gateway applies nothing new (and is not yet stale)
    assert all(v["step_index"] == 1 and not v["acknowledged"] for v in stuck)
    view = tick(api, agent, gateway)
    assert view["acknowledged"] and view["step_index"] == 2


def test_drift_on_b_blocks_the_step_that_would_send_it_traffic_until_it_is_gone(api: Api) -> None:
    """B's engine reports a KV cache dtype its class does not declare (say, started by hand with another
    --kv-cache-dtype): the step that would send B traffic waits, and goes on once the drift is gone."""
    drifting, gateway = served_by_r1(api), Gateway(api)
    drifting.reported[R2] = {"source": "reference", "settings": {"kv_cache_dtype": "bfloat16"}}
    gateway.refresh()
    start(api, spec())
    seen = run_until(api, drifting, gateway, lambda v: v["pause_reason"] == "EngineConfigDrift")
    view = seen[-1]
    assert view["phase"] == "paused" and view["step_index"] == 1 and share_of_b(view) == 0.0
    assert view["drifted"] == {R2: [f"{B_DEPLOYMENT}-0"]} and f"{B_DEPLOYMENT}-0" in view["message"]
    held = [tick(api, drifting, gateway) for _ in range(3)]
    assert all(v["step_index"] == 1 and share_of_b(v) == 0.0 for v in held)  # no traffic to a drifted engine
    del drifting.reported[R2]  # the engine replaced by one that runs its class
    run_until(api, drifting, gateway, lambda v: share_of_b(v) == 0.5)


def test_abort_returns_all_traffic_to_a_and_drains_b_then_retry_and_undo(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    start(api, spec())
    run_until(api, agent, gateway, lambda v: v["step_index"] == 2)  # in the pause, at 50%
    assert command(api, 1, "abort").json()["phase"] == "aborting"
    aborted = run_until(api, agent, gateway, lambda v: v["phase"] == "aborted")[-1]
    assert {ref: w for ref, w in weights(api).items() if w > 0} == {R1: 100.0}
    assert replicas(api) == {"chat": 1, B_DEPLOYMENT: 0} and aborted["acknowledged"]
    assert aborted["abort_reason"].startswith("aborted by test-operator-")
    nothing = command(api, 1, "undo")  # all traffic is on A already
    assert (nothing.status_code, nothing.json()["error"]["code"]) == (409, "nothing_to_roll_out")
    assert command(api, 1, "retry").json()["phase"] == "progressing"
    run_until(api, agent, gateway, lambda v: v["phase"] == "completed", limit=60)
    assert replicas(api) == {"chat": 0, B_DEPLOYMENT: 1}
    undo = command(api, 1, "undo")
    assert undo.status_code == 201, undo.text
    back = undo.json()
    assert (back["id"], back["from_ref"], back["to_ref"]) == (2, R2, R1)
    assert back["spec"]["steps"] == show(api, 1)["spec"]["steps"]
    for _ in range(60):
        api.clock.advance(1)
        api.reconcile()
        agent.settle()
        gateway.refresh()
        api.reconcile()
        if show(api, 2)["phase"] == "completed":
            break
    assert show(api, 2)["phase"] == "completed"
    assert replicas(api) == {"chat": 1, B_DEPLOYMENT: 0}  # A's own deployment scaled back up, none created
    assert "undone" in history(api, 1)


def test_promote_moves_past_an_indefinite_pause(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    start(api, spec(steps=[{"setWeight": 20}, {"pause": {}}, {"setWeight": 100}]))
    waiting = run_until(api, agent, gateway, lambda v: v["phase"] == "paused")[-1]
    assert (waiting["step_index"], waiting["pause_reason"], waiting["pause_left_s"]) == (1, "CanaryPauseStep", None)
    assert all(tick(api, agent, gateway, 60)["step_index"] == 1 for _ in range(2))  # waits however long
    assert command(api, 1, "promote").status_code == 200
    run_until(api, agent, gateway, lambda v: v["phase"] == "completed")


def test_a_timed_pause_reports_the_time_left(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    start(api, spec())
    view = run_until(api, agent, gateway, lambda v: v["phase"] == "paused")[-1]
    assert view["pause_reason"] == "CanaryPauseStep" and 0 < view["pause_left_s"] <= 10
    ends = datetime.fromisoformat(view["pause_ends_at"])  # what a client counts down to
    assert abs((ends - api.clock.now).total_seconds() - view["pause_left_s"]) < 0.01


def test_a_restarted_controller_continues_the_rollout_from_the_same_step(settings: ControllerSettings) -> None:
    clock = Clock()
    first = ControllerRuntime(settings, clock=clock)
    with TestClient(create_app(runtime=first)) as http:
        api = Api(http, first, role_tokens(first.store), clock)
        agent, gateway = served_by_r1(api), Gateway(api)
        gateway.refresh()
        start(api, spec())
        paused = run_until(api, agent, gateway, lambda v: v["phase"] == "paused")[-1]
        events_before = history(api, 1)
    assert paused["step_index"] == 2
    second = ControllerRuntime(settings, clock=clock)
    with TestClient(create_app(runtime=second)) as http:
        api = Api(http, second, api.tokens, clock)
        agent.api, gateway.api = api, api
        resumed = tick(api, agent, gateway, 0.5)
        assert (resumed["phase"], resumed["step_index"]) == ("paused", 2)  # same step, same pause
        assert history(api, 1) == events_before  # nothing repeated
        run_until(api, agent, gateway, lambda v: v["phase"] == "completed")
        events = history(api, 1)
        assert replicas(api) == {"chat": 0, B_DEPLOYMENT: 1}
    assert events.count("step_started") == 4 and events.count("step_done") == 4


def test_a_controller_back_from_an_outage_waits_for_the_gateway_it_could_not_hear(settings: ControllerSettings) -> None:
    """The controller was down for a minute, so the gateway's last report is stale, yet the gateway may
    still route on the old table (it retries within its backoff). The restarted controller waits for its
    acknowledgement for RECONNECT_GRACE_S before it treats the gateway as gone and goes on."""
    from fleetctl.controller.gateways import RECONNECT_GRACE_S

    clock = Clock()
    first = ControllerRuntime(settings, clock=clock)
    with TestClient(create_app(runtime=first)) as http:
        api = Api(http, first, role_tokens(first.store), clock)
        agent, gateway = served_by_r1(api), Gateway(api)
        gateway.refresh()
        start(api, spec())
        assert run_until(api, agent, gateway, lambda v: v["phase"] == "paused")[-1]["step_index"] == 2
    clock.advance(60)  # down: nobody heard the gateway
    second = ControllerRuntime(settings, clock=clock)
    with TestClient(create_app(runtime=second)) as http:
        api = Api(http, second, api.tokens, clock)
        agent.api, gateway.api = api, api
        held = [tick(api, agent, None, 5) for _ in range(int(RECONNECT_GRACE_S // 5) - 1)]
        assert all(v["step_index"] == 3 and not v["acknowledged"] for v in held), [v["message"] for v in held]
        assert replicas(api)["chat"] == 1  # A is not drained while the gateway may still route to it
        done = run_until(api, agent, None, lambda v: v["phase"] == "completed", limit=10, seconds=5)
        assert done[-1]["acknowledged"]  # the grace is over: the gateway is taken for gone


def test_ready_counts_each_role_only_up_to_what_it_asks_for() -> None:
    """A P/D revision is ready only when every role is: surplus prefill engines never stand in for decode."""
    from fleetctl.controller.rollout_observations import ready_toward_desired

    desired = {("b@r2", "prefill"): 1, ("b@r2", "decode"): 1}
    assert ready_toward_desired({("b@r2", "prefill"): 2}, desired) == {"b@r2": 1}  # 1 < desired 2: not ready
    assert ready_toward_desired({("b@r2", "prefill"): 2, ("b@r2", "decode"): 1}, desired) == {"b@r2": 2}
    assert ready_toward_desired({("a@r1", "mixed"): 3}, {}) == {}  # nothing asked for: nothing counted
