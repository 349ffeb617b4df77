"""Canary drills through the API, on SQLite and PostgreSQL: a misroute shows in the routing table (and only
there: the stored policy keeps the operator's weights), a plant shows in the engine's heartbeat assignment;
bad input is refused naming the field and stores nothing; one drill per model; stop; expiry at `ends_at`
with an injected clock; every start and stop audited with the drill in the reason."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from ctl_helpers import Api, apply_class, beat, deploy, observed, register

from fleetctl.controller import drills
from fleetctl.controller.rollout_observations import routing_acknowledged
from fleetctl.errors import Conflict

MODEL = "smollm2-135m"


def serve(api: Api, node: str, *refs: str) -> dict[str, Any]:
    """One deployment per revision, each engine reported ready by `node`'s agent. The last reply."""
    for ref in refs:
        deploy(api, ref.replace("@", "-"), ref, 1)
    api.reconcile()
    reply = beat(api, node)
    beat(api, node, reply["generation"], [observed(a, "ready") for a in reply["assignment"]])
    return reply


def two_revisions(api: Api) -> tuple[str, str]:
    """chat@r1 with all of the model's traffic, and a long-context chat@r2 deployed with no weight."""
    register(api, "n1")
    r1 = apply_class(api)["ref"]
    r2 = apply_class(api, max_model_len=8192)["ref"]
    serve(api, "n1", r1, r2)
    response = api.call("PUT", f"/api/v1/traffic/{MODEL}", role="operator", json={"weights": {r1: 1.0}})
    assert response.status_code == 200, response.text
    return r1, r2


def misroute(api: Api, to: str, fraction: float = 0.15, duration_s: float | None = 600.0, **extra: Any) -> Any:
    body = {"model": MODEL, "to": to, "fraction": fraction, "duration_s": duration_s, **extra}
    return api.call("POST", "/api/v1/drills/misroute", role="operator", json=body)


def plant(api: Api, engine: str, fault: str = "kv_fp16", duration_s: float | None = 600.0) -> Any:
    return api.call("POST", "/api/v1/drills/plant", role="operator",
                    json={"engine": engine, "fault": fault, "duration_s": duration_s})


def routing(api: Api) -> dict[str, Any]:
    return api.call("GET", "/api/v1/routing", role="viewer").json()


def drills_listed(api: Api) -> list[dict[str, Any]]:
    return api.call("GET", "/api/v1/drills", role="viewer").json()


def drill_audit(api: Api) -> list[dict[str, Any]]:
    return [e for e in api.call("GET", "/api/v1/audit", role="viewer").json() if e["action"].startswith("drill.")]


def test_a_misroute_sends_the_fraction_through_routing_and_leaves_the_policy(api: Api) -> None:
    r1, r2 = two_revisions(api)
    before = routing(api)
    response = misroute(api, r2, reason="does the canary see it?")
    assert response.status_code == 201, response.text
    drill = response.json()
    assert (drill["kind"], drill["model"], drill["to_ref"], drill["fraction"], drill["active"]) == (
        "misroute", MODEL, r2, 0.15, True)
    assert drill["remaining_s"] == 600.0 and drill["created_by"].startswith("test-operator")

    table = routing(api)
    assert table["generation"] == drill["generation"] > before["generation"]
    assert table["models"][MODEL]["traffic"] == pytest.approx({r1: 0.85, r2: 0.15})
    assert set(table["models"][MODEL]["classes"]) == {r1, r2}
    shown = api.call("GET", f"/api/v1/traffic/{MODEL}", role="viewer").json()
    assert shown["weights"] == {r1: 1.0} and shown["version"] == 1  # the operator's weights, untouched
    assert shown["drill"]["id"] == drill["id"]
    assert api.call("GET", "/api/v1/traffic", role="viewer").json()[MODEL]["weights"] == {r1: 1.0}

    (event,) = drill_audit(api)
    assert (event["action"], event["target"], event["result"], event["status"]) == (
        "drill.start", f"drills/{drill['id']}", "ok", 201)
    assert event["reason"] == (f"drill {drill['id']}: misroute 15% of {MODEL}'s traffic to {r2} for 10m "
                               "(does the canary see it?)")
    assert drills_listed(api) == [{k: v for k, v in drill.items() if k != "generation"}]


BAD_MISROUTES = [
    ({"fraction": 0.0}, 422, "fraction"),
    ({"fraction": 0.51}, 422, "fraction"),
    ({"fraction": -0.1}, 422, "fraction"),
    ({"duration_s": 0.0}, 422, "duration_s"),
    ({"duration_s": 4 * 3600 + 1}, 422, "duration_s"),
    ({"to": "chat@r9"}, 404, "to"),
    ({"to": "nope"}, 404, "to"),
    ({"model": "ghost"}, 404, "model"),
    ({"extra": 1}, 422, "extra"),
]


@pytest.mark.parametrize(("change", "status", "field"), BAD_MISROUTES)
def test_a_bad_misroute_is_refused_naming_the_field_and_stores_nothing(api: Api, change: dict[str, Any], status: int,
                                                                       field: str) -> None:
    _r1, r2 = two_revisions(api)
    before = routing(api)
    body = {"to": r2, "fraction": 0.15, "duration_s": 600.0, **change}
    response = misroute(api, **body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] == field
    assert drills_listed(api) == [] and routing(api) == before
    (event,) = drill_audit(api)
    assert (event["action"], event["result"], event["status"]) == ("drill.start", "refused", status)


def test_a_misroute_target_must_serve_the_model_and_not_have_all_its_traffic(api: Api) -> None:
    r1, _r2 = two_revisions(api)
    other = api.call("POST", "/api/v1/classes", role="operator",
                     json={"name": "other", "spec": {"model": "other-model", "weights": "smollm2"}}).json()["ref"]
    undeployed = apply_class(api, max_model_len=4096)["ref"]
    deploy(api, "unready", apply_class(api, max_model_len=1024)["ref"], 1)  # placed, never reported ready
    api.reconcile()
    cases = {other: (422, "validation_failed"), undeployed: (409, "not_deployed"), "chat@r4": (409, "no_ready_engines"),
             r1: (409, "nothing_to_misroute")}
    for ref, (status, code) in cases.items():
        error = misroute(api, ref).json()["error"]
        assert (error["code"], error["field"]) == (code, "to"), (ref, error)
        assert misroute(api, ref).status_code == status
    assert drills_listed(api) == []


def test_one_drill_per_model_and_stop_ends_it(api: Api) -> None:
    r1, r2 = two_revisions(api)
    first = misroute(api, r2).json()
    second = misroute(api, r2, fraction=0.3)
    assert second.status_code == 409 and second.json()["error"]["code"] == "drill_in_progress"
    assert second.json()["error"]["field"] == "model"
    engine = next(e["name"] for e in api.call("GET", "/api/v1/engines", role="viewer").json())
    assert plant(api, engine).json()["error"]["code"] == "drill_in_progress"  # the same model

    stopped = api.call("POST", f"/api/v1/drills/{first['id']}/stop", role="operator", headers={"X-Fleet-Reason": "seen"})
    assert stopped.status_code == 200, stopped.text
    result = stopped.json()
    assert result["result"] == "changed" and [d["id"] for d in result["stopped"]] == [first["id"]]
    assert result["stopped"][0]["stopped_by"].startswith("test-operator") and result["stopped"][0]["active"] is False
    table = routing(api)
    assert table["models"][MODEL]["traffic"] == {r1: 1.0} and table["generation"] == result["generation"]
    assert api.call("GET", f"/api/v1/traffic/{MODEL}", role="viewer").json()["drill"] is None

    again = api.call("POST", f"/api/v1/drills/{first['id']}/stop", role="operator").json()
    assert (again["result"], again["stopped"]) == ("unchanged", [])
    missing = api.call("POST", "/api/v1/drills/999/stop", role="operator")
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "id"
    assert misroute(api, r2).status_code == 201  # a new one, now that the first has ended
    assert api.call("POST", "/api/v1/drills/stop", role="viewer").status_code == 403

    events = [(e["action"], e["result"], e["reason"]) for e in drill_audit(api)]
    assert events[:4] == [
        ("drill.start", "ok", f"drill {first['id']}: misroute 15% of {MODEL}'s traffic to {r2} for 10m"),
        ("drill.start", "refused", None), ("drill.start", "refused", None),
        ("drill.stop", "ok", f"stop drill {first['id']}: misroute 15% of {MODEL}'s traffic to {r2} for 10m (seen)")]
    assert events[4][:2] == ("drill.stop", "noop")


def test_stop_all_ends_every_drill_in_effect(api: Api) -> None:
    _r1, r2 = two_revisions(api)
    drill = misroute(api, r2).json()
    result = api.call("POST", "/api/v1/drills/stop", role="operator").json()
    assert result["result"] == "changed" and [d["id"] for d in result["stopped"]] == [drill["id"]]
    assert api.call("POST", "/api/v1/drills/stop", role="operator").json()["result"] == "unchanged"
    assert [d["active"] for d in drills_listed(api)] == [False]


def test_a_drill_ends_at_its_end_by_the_reconciler_with_an_injected_clock(api: Api) -> None:
    r1, r2 = two_revisions(api)
    drill = misroute(api, r2, duration_s=60).json()
    api.clock.advance(59)
    api.reconcile()
    assert drills_listed(api)[0]["active"] is True
    assert routing(api)["models"][MODEL]["traffic"] == pytest.approx({r1: 0.85, r2: 0.15})

    stamped = routing(api)["generation"]
    api.clock.advance(2)
    api.reconcile()
    (ended,) = drills_listed(api)
    assert (ended["active"], ended["stopped_by"], ended["stopped_at"]) == (False, "expired", drill["ends_at"])
    table = routing(api)
    assert table["models"][MODEL]["traffic"] == {r1: 1.0} and table["generation"] == stamped + 1
    event = drill_audit(api)[-1]
    assert (event["actor"], event["action"], event["target"], event["result"]) == (
        "controller", "drill.stop", f"drills/{drill['id']}", "ok")
    assert event["reason"] == f"drill {drill['id']}: misroute 15% of {MODEL}'s traffic to {r2} for 1m: expired at {drill['ends_at']}"
    assert event["at"] == api.clock.now.isoformat()


def test_a_default_drill_lasts_twenty_minutes(api: Api) -> None:
    _r1, r2 = two_revisions(api)
    drill = misroute(api, r2, duration_s=None).json()
    assert drill["remaining_s"] == 1200.0


def test_a_plant_puts_the_fault_in_the_engines_assignment_until_it_ends(api: Api) -> None:
    register(api, "n1")
    ref = apply_class(api)["ref"]
    reply = serve(api, "n1", ref)
    (assigned,) = reply["assignment"]
    assert assigned["planted_fault"] is None
    generation = reply["generation"]

    response = plant(api, assigned["name"], "approx_topk", duration_s=120)
    assert response.status_code == 201, response.text
    drill = response.json()
    assert (drill["kind"], drill["engine"], drill["fault"], drill["model"]) == ("plant", assigned["name"], "approx_topk", MODEL)
    planted = beat(api, "n1", generation, [observed(assigned, "ready")])
    assert planted["generation"] == generation + 1
    assert [a["planted_fault"] for a in planted["assignment"]] == ["approx_topk"]
    (event,) = drill_audit(api)
    assert event["reason"] == f"drill {drill['id']}: plant approx_topk in engine {assigned['name']} ({MODEL}) for 2m"

    api.clock.advance(121)
    api.reconcile()
    clean = beat(api, "n1", planted["generation"], [observed(assigned, "ready")])
    assert clean["generation"] == generation + 2 and [a["planted_fault"] for a in clean["assignment"]] == [None]
    assert drills_listed(api)[0]["stopped_by"] == "expired"


def test_a_plant_needs_a_known_fault_and_a_running_engine(api: Api) -> None:
    register(api, "n1")
    ref = apply_class(api)["ref"]
    (assigned,) = serve(api, "n1", ref)["assignment"]
    bogus = plant(api, assigned["name"], "bogus").json()["error"]
    assert (bogus["code"], bogus["field"]) == ("validation_failed", "fault") and "kv_fp16" in bogus["message"]
    ghost = plant(api, "ghost-0")
    assert ghost.status_code == 404 and ghost.json()["error"]["field"] == "engine"
    assert plant(api, assigned["name"], duration_s=-1).json()["error"]["field"] == "duration_s"
    deploy(api, "later", ref, 1, model=MODEL)
    api.reconcile()
    pending = next(e["name"] for e in api.call("GET", "/api/v1/engines", role="viewer").json() if e["state"] == "pending")
    refused = plant(api, pending)
    assert refused.status_code == 409 and refused.json()["error"] == {
        "code": "engine_not_running", "field": "engine",
        "message": f"engine: {pending} is not running (not reported); a fault is planted in a running engine"}
    assert drills_listed(api) == []


def test_gateways_acknowledge_the_routing_table_of_a_drill_only_once_they_applied_it(api: Api) -> None:
    _r1, r2 = two_revisions(api)

    def report(generation: int) -> None:
        body = {"name": "gw-1", "url": "http://gw:8000", "generation": generation, "table_age_s": 0.1}
        assert api.call("POST", "/api/v1/gateways/report", role="viewer", json=body).status_code == 200

    def acknowledged() -> bool:
        with api.runtime.store.session() as session:
            return routing_acknowledged(session, api.clock())

    report(routing(api)["generation"])
    assert acknowledged()
    drill = misroute(api, r2).json()
    assert not acknowledged()  # the gateway still routes without the drill
    report(drill["generation"])
    assert acknowledged()
    api.clock.advance(601)
    api.reconcile()  # the drill ends: the stamped table no longer has it
    report(drill["generation"])  # live, on the table with the drill
    assert not acknowledged()
    report(routing(api)["generation"])
    assert acknowledged()


def test_concurrent_starts_for_one_model_leave_one_drill(api: Api) -> None:
    _r1, r2 = two_revisions(api)
    barrier = threading.Barrier(4)

    def start(fraction: float) -> str:
        barrier.wait()
        try:
            with api.runtime.store.session() as session:
                drills.start_misroute(session, MODEL, r2, fraction, 600.0, "racer", api.clock())
            return "started"
        except Conflict as exc:
            return exc.code

    with ThreadPoolExecutor(4) as pool:
        outcomes = sorted(pool.map(start, [0.1, 0.2, 0.3, 0.4]))
    assert outcomes == ["drill_in_progress"] * 3 + ["started"]
    assert [d["active"] for d in drills_listed(api)] == [True]
