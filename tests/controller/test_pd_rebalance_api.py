"""P:D rebalances through the API, on SQLite and PostgreSQL: the preview, every refusal (nothing stored),
a whole rebalance driven by reconciles and a simulated agent, one at a time, stop, and a controller that
restarts mid-flip and continues the same flip."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api, Clock, apply_class, deploy
from fastapi.testclient import TestClient
from rollout_helpers import Agent

from fleetctl.controller.api.app import create_app
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens

MODEL = "smollm2-135m"
REF = "chat@r1"


def pd_fleet(api: Api, prefill: int = 1, decode: int = 3) -> Agent:
    agent = Agent(api)
    apply_class(api)
    deploy(api, "chat-prefill", REF, prefill, role="prefill")
    deploy(api, "chat-decode", REF, decode, role="decode")
    api.reconcile()
    agent.settle()
    return agent


def rebalance(api: Api, role: str = "operator", **body: Any) -> Any:
    return api.call("POST", f"/api/v1/pd/models/{MODEL}/rebalance", role=role, json=body)


def rebalances(api: Api) -> list[dict[str, Any]]:
    response = api.call("GET", "/api/v1/pd/rebalances", role="viewer")
    assert response.status_code == 200, response.text
    return response.json()


def deployments(api: Api) -> dict[str, tuple[str, int]]:
    return {d["name"]: (d["role"], d["replicas"]) for d in api.call("GET", "/api/v1/deployments", role="viewer").json()}


def drive(api: Api, agent: Agent, rebalance_id: int, passes: int = 30) -> dict[str, Any]:
    """Reconcile and let the agent settle until the rebalance is terminal."""
    view: dict[str, Any] = {}
    for _ in range(passes):
        api.reconcile()
        agent.settle()
        api.clock.advance(1.0)
        view = api.call("GET", f"/api/v1/pd/rebalances/{rebalance_id}", role="viewer").json()
        if view["phase"] in ("completed", "stopped"):
            return view
    raise AssertionError(f"rebalance {rebalance_id} did not finish: {view}")


def test_preview_lists_the_flips_and_stores_nothing(api: Api) -> None:
    pd_fleet(api)
    response = rebalance(api, prefill=2, decode=2)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["rebalance"] is None
    preview = body["preview"]
    assert preview["current"] == {"prefill": 1, "decode": 3, "mixed": 0}
    assert preview["target"] == {"prefill": 2, "decode": 2, "mixed": 0}
    assert [(f["from_role"], f["to_role"]) for f in preview["flips"]] == [("decode", "prefill")]
    assert preview["flips"][0]["engine"].startswith("chat-decode-")
    assert any(line.startswith("prefill capacity 1 x") for line in preview["effect"])
    assert rebalances(api) == []


def test_bad_targets_are_refused_naming_the_field_and_nothing_is_stored(api: Api) -> None:
    pd_fleet(api)
    before = deployments(api)
    cases = [
        ({"prefill": 0, "decode": 4}, 422, "prefill"),  # below the floor
        ({"prefill": 3, "decode": 3}, 422, "prefill"),  # another engine count
        ({"prefill": 1, "decode": 2, "mixed": 1, "floor_decode": 3}, 422, "decode"),
        ({"prefill": -1, "decode": 5}, 422, "prefill"),  # pydantic: a count is >= 0
    ]
    for body, status, field in cases:
        response = rebalance(api, apply=True, **body)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["field"].endswith(field), (body, response.json())
    unknown = api.call("POST", "/api/v1/pd/models/nope/rebalance", role="operator",
                       json={"prefill": 1, "decode": 1, "apply": True})
    assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "model"
    assert rebalance(api, role="viewer", prefill=2, decode=2, apply=True).status_code == 403
    assert deployments(api) == before
    assert rebalances(api) == []


def test_a_mixed_only_model_needs_mixed_to_convert(api: Api) -> None:
    agent = Agent(api)
    apply_class(api)
    deploy(api, "chat", REF, 3)
    api.reconcile()
    agent.settle()
    refused = rebalance(api, prefill=1, decode=2, apply=True)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "mixed"
    assert "no prefill or decode engines" in refused.json()["error"]["message"]
    started = rebalance(api, prefill=1, decode=1, mixed=1, apply=True, baseline_s=0)
    assert started.status_code == 200, started.text
    view = drive(api, agent, started.json()["rebalance"]["id"])
    assert view["phase"] == "completed", view
    roles = sorted(role for role, replicas in deployments(api).values() for _ in range(replicas))
    assert roles == ["decode", "mixed", "prefill"]


def test_frozen_fleet_and_running_rebalance_are_refused(api: Api) -> None:
    pd_fleet(api)
    freeze = api.call("POST", "/api/v1/breakglass/freeze", role="admin", json={"reason": "incident"})
    assert freeze.status_code == 200, freeze.text
    frozen = rebalance(api, prefill=2, decode=2, apply=True)
    assert frozen.status_code == 409 and frozen.json()["error"]["code"] == "frozen"
    assert api.call("POST", "/api/v1/breakglass/unfreeze", role="admin", json={"reason": "over"}).status_code == 200
    first = rebalance(api, prefill=2, decode=2, apply=True)
    assert first.status_code == 200, first.text
    second = rebalance(api, prefill=3, decode=1, apply=True)
    assert second.status_code == 409 and second.json()["error"]["code"] == "rebalance_in_progress"
    assert len(rebalances(api)) == 1


def test_a_rebalance_flips_one_engine_at_a_time_to_the_target(api: Api) -> None:
    agent = pd_fleet(api, prefill=1, decode=3)
    started = rebalance(api, prefill=3, decode=1, apply=True, baseline_s=0, reason="prefill-heavy traffic")
    assert started.status_code == 200, started.text
    rebalance_id = started.json()["rebalance"]["id"]
    seen_engines: list[int] = []
    for _ in range(40):
        api.reconcile()
        agent.settle()
        api.clock.advance(1.0)
        seen_engines.append(len(agent.engines))
        view = api.call("GET", f"/api/v1/pd/rebalances/{rebalance_id}", role="viewer").json()
        if view["phase"] == "completed":
            break
    assert view["phase"] == "completed", view
    assert deployments(api) == {"chat-prefill": ("prefill", 3), "chat-decode": ("decode", 1)}
    flipped = [f["engine"] for f in view["flips"]]
    assert len(flipped) == 2 and len(set(flipped)) == 2 and all(e.startswith("chat-decode-") for e in flipped)
    assert min(seen_engines) >= 3  # one engine out at a time, never two
    events = [e["event"] for e in view["events"]]
    assert events[0] == "created" and events[-1] == "completed"
    assert events.count("flip_started") == 2 and events.count("flip_done") == 2
    audit = api.call("GET", "/api/v1/audit", role="admin", params={"limit": 200}).json()
    actions = {e["action"] for e in audit}
    assert {"pd.rebalance", "rebalance.drain_engine", "rebalance.scale_role", "rebalance.completed"} <= actions


def test_stop_lets_the_flip_in_progress_finish(api: Api) -> None:
    agent = pd_fleet(api, prefill=1, decode=3)
    rebalance_id = rebalance(api, prefill=3, decode=1, apply=True, baseline_s=0).json()["rebalance"]["id"]
    api.reconcile()  # baseline, then the first flip starts
    stop = api.call("POST", f"/api/v1/pd/rebalances/{rebalance_id}/stop", role="operator", json={"reason": "enough"})
    assert stop.status_code == 200 and stop.json()["stop_requested"], stop.text
    view = drive(api, agent, rebalance_id)
    assert view["phase"] == "stopped" and "stopped by" in view["message"]
    assert len(view["flips"]) == 1 and view["flips"][0]["phase"] == "done"
    assert deployments(api) == {"chat-prefill": ("prefill", 2), "chat-decode": ("decode", 2)}
    again = api.call("POST", f"/api/v1/pd/rebalances/{rebalance_id}/stop", role="operator", json={})
    assert again.status_code == 409 and again.json()["error"]["code"] == "rebalance_done"


def test_a_restarted_controller_continues_the_same_flip(settings: ControllerSettings) -> None:
    clock = Clock()
    first = ControllerRuntime(settings, clock=clock)
    with TestClient(create_app(runtime=first)) as http:
        api = Api(http, first, role_tokens(first.store), clock)
        agent = pd_fleet(api, prefill=1, decode=3)
        rebalance_id = rebalance(api, prefill=2, decode=2, apply=True, baseline_s=0).json()["rebalance"]["id"]
        api.reconcile()  # the flip starts: its engine is draining
        draining = api.call("GET", f"/api/v1/pd/rebalances/{rebalance_id}", role="viewer").json()["flips"]
    assert [f["phase"] for f in draining] == ["draining"]
    second = ControllerRuntime(settings, clock=clock)
    with TestClient(create_app(runtime=second)) as http:
        api = Api(http, second, api.tokens, clock)
        agent.api = api
        view = drive(api, agent, rebalance_id)
        final = deployments(api)
    assert view["phase"] == "completed", view
    assert [f["engine"] for f in view["flips"]] == [draining[0]["engine"]]  # the same flip, no second one
    assert [e["event"] for e in view["events"]].count("flip_started") == 1
    assert final == {"chat-prefill": ("prefill", 2), "chat-decode": ("decode", 2)}


def test_bad_planner_settings_and_profiles_are_refused_naming_the_field_and_nothing_is_stored(api: Api) -> None:
    pd_fleet(api)
    cases = [
        (f"/api/v1/pd/models/{MODEL}/settings", {"cooldown_s": -1, "reason": "x"}, "cooldown_s"),
        (f"/api/v1/pd/models/{MODEL}/settings", {"dwell_s": 4000, "reason": "x"}, "dwell_s"),
        (f"/api/v1/pd/profiles/{REF}", {"prefill_tokens_per_s": 800, "decode_slots": 8, "decode_itl_s": 0,
                                        "reason": "x"}, "decode_itl_s"),
    ]
    for path, body, field in cases:
        response = api.call("PUT", path, role="operator", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["field"].endswith(field), (body, response.json())
    assert api.call("GET", "/api/v1/pd/profiles", role="viewer").json() == []
    stored = api.call("PUT", f"/api/v1/pd/models/{MODEL}/settings", role="operator", json={"dwell_s": 10, "reason": "x"})
    assert stored.status_code == 200, stored.text
    # the refused cooldown was not stored: the default stands beside the dwell just set
    assert (stored.json()["settings"]["cooldown_s"], stored.json()["settings"]["dwell_s"]) == (300.0, 10.0)
