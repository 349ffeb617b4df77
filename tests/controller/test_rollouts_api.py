"""Rollouts through the API, on SQLite and PostgreSQL: start, list, show, history; every bad spec refused
whole (a 422 naming the field, nothing stored, the refusal audited); one rollout per model; the quality gate
that cannot be measured; operator commands, their refusals, If-Match and roles; undo refused while active."""

from __future__ import annotations

from typing import Any

import pytest
from ctl_helpers import Api
from rollout_helpers import MODEL, R1, R2, audit_actions, command, history, rollouts, served_by_r1, show, spec, start

BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown revision", {"to": "chat@r9"}, "spec.to"),
    ("weight above 100", {"steps": [{"setWeight": 150}]}, "spec.steps.0.setWeight"),
    ("weight below 0", {"steps": [{"setWeight": -5}]}, "spec.steps.0.setWeight"),
    ("weights decreasing", {"steps": [{"setWeight": 50}, {"setWeight": 10}]}, "spec.steps.1.setWeight"),
    ("unknown step type", {"steps": [{"scale": {}}, {"canary": 5}]}, "spec.steps.1"),
    ("negative pause", {"steps": [{"setWeight": 10}, {"pause": {"duration": "-1m"}}]}, "spec.steps.1.pause.duration"),
    ("unknown measure", {"steps": [{"analysis": {"templates": ["lat"]}}],
                         "templates": {"lat": {"metrics": [{"name": "x", "measure": "ttft_p42_s",
                                                            "successCondition": "result < 1"}]}}},
     "spec.templates.lat.metrics.0.measure"),
    ("unknown template", {"steps": [{"analysis": {"templates": ["nope"]}}]}, "spec.steps.0.analysis.templates"),
    ("unknown field", {"stepz": []}, "spec.stepz"),
]


def test_a_rollout_is_started_listed_shown_and_audited(api: Api) -> None:
    served_by_r1(api)
    response = start(api, spec())
    assert response.status_code == 201, response.text
    view = response.json()
    assert (view["model"], view["from_ref"], view["to_ref"], view["phase"], view["step_index"]) == (
        MODEL, R1, R2, "progressing", 0)
    assert [(s["text"], s["status"]) for s in view["steps"]] == [
        ("scale (as many engines as A has)", "current"), ("setWeight 50", "pending"), ("pause 10s", "pending"),
        ("setWeight 100", "pending")]
    assert view["weights"] == {R1: 100.0} and view["ready"] == {R1: 1, R2: 0} and view["progress"] == 0.0
    assert view["spec"]["from"] == R1 and view["spec"]["steps"][2] == {"pause": {"duration": 10.0}}
    assert view["created_by"].startswith("test-operator-")
    assert [r["id"] for r in rollouts(api)] == [view["id"]]
    assert [r["id"] for r in rollouts(api, model=MODEL, active=True)] == [view["id"]]
    assert rollouts(api, active=False) == [] and rollouts(api, model="other") == []
    assert show(api, view["id"])["version"] == view["version"]
    assert history(api, view["id"]) == ["started"]
    assert audit_actions(api) == [("rollout.start", "ok", None)]


def test_a_model_without_a_traffic_policy_gets_a_at_100_when_a_rollout_starts(api: Api) -> None:
    """Without a stored policy the routing table would spread traffic over every deployed revision, so B's
    deployment would get requests the moment `scale` created it, before its engines were ready."""
    served_by_r1(api, policy=False)
    assert api.call("GET", "/api/v1/traffic", role="viewer").json() == {}
    response = start(api, spec())
    assert response.status_code == 201, response.text
    assert api.call("GET", "/api/v1/traffic", role="viewer").json()[MODEL]["weights"] == {R1: 100.0}


@pytest.mark.parametrize("case", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_every_bad_spec_is_refused_naming_the_field_and_nothing_is_stored(api: Api, case: tuple[str, dict[str, Any], str]) -> None:
    served_by_r1(api)
    _name, changes, field = case
    response = start(api, spec(**changes))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field and error["message"].startswith(f"{field}: "), error
    assert rollouts(api) == []
    assert audit_actions(api) == [("rollout.start", "refused", "unknown_class" if field == "spec.to" else "validation_failed")]


def test_an_undeclared_correctness_change_is_refused_listing_the_fields(api: Api) -> None:
    served_by_r1(api, max_model_len=8192, kv_cache_dtype="bfloat16")
    response = start(api, spec())
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "spec.allowCorrectnessChange"
    assert "kv_cache_dtype auto -> bfloat16" in error["message"] and "max_model_len 2048 -> 8192" in error["message"]
    assert rollouts(api) == []


def test_an_allowed_correctness_change_needs_the_quality_gate(api: Api) -> None:
    served_by_r1(api, max_model_len=8192)
    response = start(api, spec(allowCorrectnessChange={"reason": "longer context, checked offline"}))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "spec.templates" and "measure: quality" in error["message"]
    assert rollouts(api) == []


def test_an_allowed_correctness_change_with_a_quality_gate_waits_for_the_canary(api: Api) -> None:
    """The gate exists in the spec, but no canary measures quality yet: refused, saying why, nothing stored."""
    served_by_r1(api, max_model_len=8192)
    golden = {"golden": {"metrics": [{"name": "q", "measure": "quality", "successCondition": "result >= 1"}]}}
    steps = [{"scale": {}}, {"setWeight": 10}, {"analysis": {"templates": ["golden"]}}, {"setWeight": 100}]
    response = start(api, spec(allowCorrectnessChange={"reason": "longer context"}, templates=golden, steps=steps))
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "quality_gate_unavailable" and error["message"].startswith("quality: not measured")
    assert rollouts(api) == []


def test_a_second_rollout_of_the_model_is_refused_naming_the_running_one(api: Api) -> None:
    served_by_r1(api)
    first = start(api, spec()).json()
    response = start(api, spec())
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "rollout_in_progress" and f"rollout {first['id']} " in error["message"]
    assert [r["id"] for r in rollouts(api)] == [first["id"]]


def test_a_spec_that_needs_the_quality_gate_cannot_start_and_says_why(api: Api) -> None:
    served_by_r1(api)
    templates = {"golden": {"metrics": [{"name": "q", "measure": "quality", "successCondition": "result >= 1"}]}}
    response = start(api, spec(steps=[*spec()["steps"][:2], {"analysis": {"templates": ["golden"]}}], templates=templates))
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "quality_gate_unavailable" and error["message"].startswith("quality: not measured")
    assert rollouts(api) == []


def test_without_from_a_split_model_is_refused(api: Api) -> None:
    served_by_r1(api)
    api.call("PUT", "/api/v1/deployments/chat-2", role="operator", json={"class_ref": R2, "replicas": 1})
    api.reconcile()
    # r2 has no ready engine, so a split over both is refused by the traffic guard: store it directly
    from fleetctl.controller.models import TrafficPolicy

    with api.runtime.store.session() as session:
        session.get(TrafficPolicy, MODEL).weights = {R1: 50, R2: 50}
    response = start(api, spec())
    assert (response.status_code, response.json()["error"]["code"]) == (409, "traffic_split")
    assert start(api, spec(**{"from": R1})).status_code == 201


def test_operator_commands_change_the_state_and_are_recorded(api: Api) -> None:
    served_by_r1(api)
    rollout_id = start(api, spec()).json()["id"]
    paused = command(api, rollout_id, "pause")
    assert paused.status_code == 200, paused.text
    assert (paused.json()["phase"], paused.json()["paused_by"]) == ("paused", paused.json()["created_by"])
    again = command(api, rollout_id, "pause")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "already_paused")
    assert command(api, rollout_id, "resume").json()["phase"] == "progressing"
    refused = command(api, rollout_id, "retry")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "not_aborted")
    assert command(api, rollout_id, "abort").json()["phase"] == "aborting"
    assert history(api, rollout_id) == ["started", "paused", "resumed", "aborting"]
    assert [a for a in audit_actions(api) if a[0] == "rollout.command"] == [
        ("rollout.command", "ok", None), ("rollout.command", "refused", "already_paused"),
        ("rollout.command", "ok", None), ("rollout.command", "refused", "not_aborted"), ("rollout.command", "ok", None)]


def test_commands_need_an_operator_and_check_if_match(api: Api) -> None:
    served_by_r1(api)
    view = start(api, spec()).json()
    assert command(api, view["id"], "pause", role="viewer").status_code == 403
    stale = api.call("POST", f"/api/v1/rollouts/{view['id']}/pause", role="operator",
                     headers={"If-Match": f'"{view["version"] + 5}"'})
    assert (stale.status_code, stale.json()["error"]["code"]) == (409, "version_conflict")
    fresh = api.call("POST", f"/api/v1/rollouts/{view['id']}/pause", role="operator",
                     headers={"If-Match": f'"{view["version"]}"'})
    assert fresh.status_code == 200 and fresh.json()["version"] == view["version"] + 1
    assert command(api, view["id"], "explode").status_code == 422
    assert command(api, 999, "pause").status_code == 404


def test_undo_is_refused_while_the_rollout_is_active(api: Api) -> None:
    served_by_r1(api)
    rollout_id = start(api, spec()).json()["id"]
    response = command(api, rollout_id, "undo")
    assert (response.status_code, response.json()["error"]["code"]) == (409, "rollout_in_progress")
    assert len(rollouts(api)) == 1
