"""Feature flags through the API, on SQLite and PostgreSQL, under an injected clock: only catalog flags of
their type, with a reason; overrides reach the routing table; a TTL reverts the flag by itself (audited,
the routing generation stamped); unset; the controller's own flags (`reconciler`, `rollout_automation`,
`canary_probes`) change what its reconcilers do."""

from __future__ import annotations

from typing import Any

import pytest
from ctl_helpers import Api, apply_class, beat, deploy, register
from rollout_helpers import R2, Gateway, served_by_r1, spec, start, tick

from fleetctl.flag_catalog import CATALOG, FlagError, coerce, parse_key, parse_ttl, value_of

REASON = {"reason": "test: flags"}


def put(api: Api, key: str, value: Any, role: str = "operator", **body: Any) -> Any:
    return api.call("PUT", f"/api/v1/flags/{key}", role=role, json={"value": value, **REASON, **body})


def routing_flags(api: Api) -> dict[str, Any]:
    return api.call("GET", "/api/v1/routing", role="viewer").json()["flags"]


def listed(api: Api) -> dict[str, Any]:
    return api.call("GET", "/api/v1/flags", role="viewer").json()


def audit(api: Api) -> list[dict[str, Any]]:
    return [e for e in api.call("GET", "/api/v1/audit", role="viewer").json() if e["action"].startswith("flag")]


# --- the catalog (pure) ---

def test_the_catalog_parses_keys_and_coerces_values() -> None:
    assert parse_key("prefix_routing") == (CATALOG["prefix_routing"], None)
    assert parse_key("shed_fraction:chat") == (CATALOG["shed_fraction"], "chat")
    for bad, field in (("nope", "name"), ("shed_fraction", "name"), ("prefix_routing:chat", "name")):
        with pytest.raises(FlagError) as caught:
            parse_key(bad)
        assert caught.value.field == field
    assert coerce(CATALOG["prefix_routing"], "off") is False and coerce(CATALOG["shed_fraction"], "0.25") == 0.25
    for spec, bad in ((CATALOG["prefix_routing"], 0.5), (CATALOG["shed_fraction"], 1.5), (CATALOG["shed_fraction"], True)):
        with pytest.raises(FlagError) as caught:
            coerce(spec, bad)
        assert caught.value.field == "value"
    assert value_of({}, "prefix_routing") is True and value_of({"shed_fraction:chat": 0.3}, "shed_fraction", "chat") == 0.3
    assert value_of({"shed_fraction:other": 0.3}, "shed_fraction", "chat") == 0.0
    assert value_of({"prefix_routing": "garbage"}, "prefix_routing") is True  # a hand-written bad value: the default
    assert parse_ttl("30m") == 1800 and parse_ttl("90") == 90 and parse_ttl("1d") == 86400
    for bad in ("0", "-5m", "40d", "soon"):
        with pytest.raises(ValueError):
            parse_ttl(bad)


# --- validation: refused whole, nothing stored ---

@pytest.mark.parametrize(("key", "value", "body", "field"), [
    ("no_such_flag", True, {}, "name"),
    ("shed_fraction", 0.5, {}, "name"),  # per model: needs NAME:MODEL
    ("prefix_routing:chat", False, {}, "name"),  # fleet-wide: takes no model
    ("prefix_routing", 0.5, {}, "value"),
    ("shed_fraction:chat", 2.0, {}, "value"),
    ("shed_fraction:chat", 0.5, {"ttl_s": -1}, "ttl_s"),
])
def test_a_bad_flag_is_a_422_naming_the_field_and_stores_nothing(api: Api, key: str, value: Any,
                                                                 body: dict[str, Any], field: str) -> None:
    before = (listed(api), routing_flags(api))
    response = put(api, key, value, **body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert field in (error.get("field") or "") + error["message"], error
    assert (listed(api), routing_flags(api)) == before


def test_an_override_needs_a_reason_and_the_operator_role(api: Api) -> None:
    response = api.call("PUT", "/api/v1/flags/prefix_routing", role="operator", json={"value": False})
    assert response.status_code == 422 and response.json()["error"]["field"] == "reason"
    assert put(api, "prefix_routing", False, role="viewer").status_code == 403
    assert routing_flags(api) == {}


# --- set, list, routing table, unset ---

def test_an_override_reaches_the_routing_table_and_unset_restores_the_default(api: Api) -> None:
    response = put(api, "shed_fraction:chat", "0.25")
    assert response.status_code == 200, response.text
    result = response.json()
    assert (result["name"], result["value"], result["result"]) == ("shed_fraction:chat", 0.25, "changed")
    assert routing_flags(api) == {"shed_fraction:chat": 0.25}
    assert api.call("GET", "/api/v1/routing", role="viewer").json()["generation"] >= result["generation"]
    view = listed(api)["shed_fraction:chat"]
    assert (view["value"], view["default"], view["overridden"], view["reason"]) == (0.25, 0.0, True, "test: flags")
    assert view["updated_by"].startswith("test-operator") and view["expires_at"] is None
    fleet_wide = listed(api)["prefix_routing"]
    assert (fleet_wide["value"], fleet_wide["overridden"], fleet_wide["read_by"]) == (True, False, "gateway")
    assert put(api, "shed_fraction:chat", 0.25).json()["result"] == "unchanged"
    removed = api.call("DELETE", "/api/v1/flags/shed_fraction:chat", role="operator", headers={"X-Fleet-Reason": "done"})
    assert removed.status_code == 200 and removed.json()["result"] == "changed" and removed.json()["value"] == 0.0
    assert routing_flags(api) == {} and "shed_fraction:chat" not in listed(api)
    assert [(e["action"], e["target"], e["result"]) for e in audit(api)][-3:] == [
        ("flag.set", "flags/shed_fraction:chat", "ok"), ("flag.set", "flags/shed_fraction:chat", "noop"),
        ("flag.unset", "flags/shed_fraction:chat", "ok")]


def test_an_override_with_a_ttl_reverts_by_itself_audited(api: Api) -> None:
    response = put(api, "prefix_routing", False, ttl_s=60)
    assert response.status_code == 200 and response.json()["expires_at"] is not None
    generation = response.json()["generation"]
    api.clock.advance(30)
    api.reconcile()
    assert routing_flags(api) == {"prefix_routing": False}
    assert listed(api)["prefix_routing"]["value"] is False
    api.clock.advance(31)  # past the TTL: it no longer counts, even before the reconciler runs
    assert listed(api)["prefix_routing"]["value"] is True
    api.reconcile()
    assert routing_flags(api) == {}
    assert api.call("GET", "/api/v1/routing", role="viewer").json()["generation"] > generation
    (expired,) = [e for e in audit(api) if e["action"] == "flag.expired"]
    assert (expired["actor"], expired["target"]) == ("controller", "flags/prefix_routing")
    assert "TTL" in expired["reason"]


def test_setting_again_renews_the_ttl(api: Api) -> None:
    put(api, "admission_control", False, ttl_s=60)
    api.clock.advance(50)
    assert put(api, "admission_control", False, ttl_s=60).json()["result"] == "changed"  # renewed
    api.clock.advance(50)
    api.reconcile()
    assert routing_flags(api) == {"admission_control": False}


# --- the controller's own flags ---

def test_the_reconciler_flag_off_stops_placement_and_on_resumes_it(api: Api) -> None:
    apply_class(api)
    register(api, "n1")
    assert put(api, "reconciler", False).status_code == 200
    deploy(api, "chat", "chat@r1", 2)
    api.reconcile()
    assert beat(api, "n1")["assignment"] == []  # nothing placed while it is off
    assert api.call("DELETE", "/api/v1/flags/reconciler", role="operator",
                    headers={"X-Fleet-Reason": "done"}).status_code == 200
    api.reconcile()
    assert len(beat(api, "n1")["assignment"]) == 2


def test_rollout_automation_off_pauses_rollouts_as_a_freeze_and_on_resumes_them(api: Api) -> None:
    agent, gateway = served_by_r1(api), Gateway(api)
    gateway.refresh()
    assert start(api, spec()).status_code == 201
    assert put(api, "rollout_automation", False).status_code == 200
    held = [tick(api, agent, gateway) for _ in range(3)][-1]
    assert (held["phase"], held["paused_by"], held["step_index"]) == ("paused", "freeze", 0), held
    api.call("DELETE", "/api/v1/flags/rollout_automation", role="operator", headers={"X-Fleet-Reason": "done"})
    moved = [tick(api, agent, gateway) for _ in range(5)][-1]
    assert moved["paused_by"] is None and moved["step_index"] > 0, moved
    assert R2 in moved["desired"]
