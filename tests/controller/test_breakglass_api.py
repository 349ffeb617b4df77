"""Break-glass levers through the API, on SQLite and PostgreSQL: admin only and a reason always (each
refusal audited, nothing written); freeze holds placement and rollouts until unfreeze; pin sends a model's
traffic to one revision that serves it and holds its rollouts until unpin; shed and kill-switch write the
flags the gateways apply; `fleetctl status` reads the holds."""

from __future__ import annotations

from typing import Any

import pytest
from ctl_helpers import Api, apply_class, beat, deploy, register
from rollout_helpers import MODEL, R1, R2, Gateway, served_by_r1, spec, start, tick

WHY = {"reason": "incident: answers degraded"}


def lever(api: Api, path: str, role: str = "admin", method: str = "POST", **body: Any) -> Any:
    return api.call(method, f"/api/v1/breakglass/{path}", role=role, json={**WHY, **body})


def routing_flags(api: Api) -> dict[str, Any]:
    return api.call("GET", "/api/v1/routing", role="viewer").json()["flags"]


def holds(api: Api) -> dict[str, Any]:
    return api.call("GET", "/api/v1/status", role="viewer").json()["break_glass"]


def audited(api: Api) -> list[tuple[str, str, int]]:
    return [(e["action"], e["result"], e["status"]) for e in api.call("GET", "/api/v1/audit", role="viewer").json()
            if e["action"].startswith("breakglass")]


@pytest.mark.parametrize("path, body", [("freeze", {}), ("pin/chat", {"class_ref": "chat@r1"}),
                                        ("shed/chat", {"fraction": 0.5}), ("kill-switch/prefix_routing", {})])
def test_a_lever_needs_the_admin_role_and_a_reason_and_each_refusal_is_audited(api: Api, path: str,
                                                                                body: dict[str, Any]) -> None:
    assert lever(api, path, role="operator", **body).status_code == 403
    response = api.call("POST", f"/api/v1/breakglass/{path}", role="admin", json=body)
    assert response.status_code == 422 and response.json()["error"]["field"] == "reason", response.text
    assert routing_flags(api) == {}
    assert [(result, status) for _action, result, status in audited(api)] == [("refused", 403), ("refused", 422)]


def test_a_break_glass_flag_is_not_an_operators_to_set_as_a_plain_flag(api: Api) -> None:
    response = api.call("PUT", "/api/v1/flags/freeze", role="operator", json={"value": True, **WHY})
    assert response.status_code == 403
    assert api.call("PUT", "/api/v1/flags/freeze", role="admin", json={"value": True, **WHY}).status_code == 200
    assert holds(api)["frozen"] is True


def test_freeze_stops_placement_and_holds_rollouts_and_unfreeze_resumes_both(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    assert start(api, spec()).status_code == 201
    frozen = lever(api, "freeze", ttl_s=3600)
    assert frozen.status_code == 200 and frozen.json()["value"] is True, frozen.text
    status = holds(api)
    assert status["frozen"] is True and status["freeze"]["reason"] == WHY["reason"]
    assert status["freeze"]["updated_by"].startswith("test-admin") and status["freeze"]["expires_at"]
    held = [tick(api, agent, gateway) for _ in range(3)][-1]
    assert (held["phase"], held["paused_by"], held["step_index"]) == ("paused", "freeze", 0), held
    register(api, "n2")
    deploy(api, "extra", R1, 1)
    api.reconcile()
    assert beat(api, "n2")["assignment"] == []  # the frozen reconciler placed nothing
    resumed = api.call("POST", "/api/v1/rollouts/1/resume", role="operator", json=WHY)
    assert resumed.status_code == 409 and resumed.json()["error"]["code"] == "frozen"
    assert lever(api, "unfreeze").json()["result"] == "changed"
    moved = [tick(api, agent, gateway) for _ in range(5)][-1]
    assert moved["paused_by"] is None and moved["step_index"] > 0, moved
    assert holds(api)["frozen"] is False
    assert [action for action, _result, _status in audited(api)] == ["breakglass.freeze", "breakglass.unfreeze"]


def test_a_pin_must_name_a_revision_that_serves_the_model_with_a_ready_engine(api: Api) -> None:
    served_by_r1(api)
    unknown = lever(api, "pin/nobody", class_ref=R1)
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "model"
    undeployed = lever(api, f"pin/{MODEL}", class_ref=R2)
    assert undeployed.status_code == 422 and undeployed.json()["error"]["field"] == "class_ref"
    deploy(api, "next", R2, 1)  # deployed, but no engine of it is ready yet
    not_ready = lever(api, f"pin/{MODEL}", class_ref=R2)
    assert not_ready.status_code == 409 and not_ready.json()["error"]["code"] == "no_ready_engines"
    malformed = lever(api, f"pin/{MODEL}", class_ref="chat")
    assert malformed.status_code == 422 and malformed.json()["error"]["field"] == "class_ref"
    assert routing_flags(api) == {}


def test_a_pin_reaches_the_routing_table_holds_the_models_rollout_and_unpin_resumes_it(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    assert start(api, spec()).status_code == 201
    pinned = lever(api, f"pin/{MODEL}", class_ref=R1)
    assert pinned.status_code == 200, pinned.text
    assert routing_flags(api) == {f"pin:{MODEL}": R1}
    assert holds(api)["pins"][MODEL]["value"] == R1
    held = [tick(api, agent, gateway) for _ in range(3)][-1]
    assert (held["phase"], held["paused_by"], held["pause_reason"]) == ("paused", "pin", "BreakGlassPin"), held
    promoted = api.call("POST", "/api/v1/rollouts/1/promote", role="operator", json=WHY)
    assert promoted.status_code == 409 and promoted.json()["error"]["code"] == "pinned"
    unpinned = api.call("DELETE", f"/api/v1/breakglass/pin/{MODEL}", role="admin",
                        headers={"X-Fleet-Reason": "incident over"})
    assert unpinned.status_code == 200 and unpinned.json()["result"] == "changed", unpinned.text
    moved = [tick(api, agent, gateway) for _ in range(5)][-1]
    assert moved["paused_by"] is None and moved["step_index"] > 0, moved
    assert holds(api)["pins"] == {}


def test_shed_writes_the_models_shed_fraction_and_zero_stops_it(api: Api) -> None:
    apply_class(api)
    deploy(api, "chat", "chat@r1", 1)
    assert lever(api, "shed/nobody", fraction=0.5).json()["error"]["field"] == "model"
    too_much = lever(api, f"shed/{MODEL}", fraction=1.5)
    assert too_much.status_code == 422 and too_much.json()["error"]["field"] == "fraction"
    assert lever(api, f"shed/{MODEL}", fraction=0.3).status_code == 200
    assert routing_flags(api) == {f"shed_fraction:{MODEL}": 0.3}
    assert lever(api, f"shed/{MODEL}", fraction=0).json()["result"] == "changed"
    assert routing_flags(api) == {}


def test_a_kill_switch_turns_a_default_on_flag_off_and_nothing_else(api: Api) -> None:
    assert lever(api, "kill-switch/prefix_routing").json()["value"] is False
    per_model = lever(api, "kill-switch/pd_disaggregation", model="chat")
    assert per_model.status_code == 200 and per_model.json()["name"] == "pd_disaggregation:chat"
    assert routing_flags(api) == {"prefix_routing": False, "pd_disaggregation:chat": False}
    for flag, field in (("freeze", "flag"), ("shed_fraction", "flag"), ("nonsense", "flag")):
        response = lever(api, f"kill-switch/{flag}")
        assert response.status_code == 422 and response.json()["error"]["field"] == field, (flag, response.text)
    missing_model = lever(api, "kill-switch/pd_disaggregation")
    assert missing_model.status_code == 422 and missing_model.json()["error"]["field"] == "model"
