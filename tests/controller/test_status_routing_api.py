"""Fleet-wide reads: status (one call), the routing table of docs/contracts.md, traffic and flags."""

from __future__ import annotations

from ctl_helpers import Api, apply_class, beat, deploy, observed, register


def fleet_with_engines(api: Api) -> None:
    register(api, "n1", labels={"zone": "a"})
    chat = apply_class(api)["ref"]
    deploy(api, "chat-prefill", chat, 1, role="prefill")
    deploy(api, "chat-decode", chat, 1, role="decode")
    api.reconcile()
    reply = beat(api, "n1")
    beat(api, "n1", reply["generation"], [observed(reply["assignment"][0], "ready")])


def test_status_shows_nodes_engines_and_deployments(api: Api) -> None:
    fleet_with_engines(api)
    status = api.call("GET", "/api/v1/status", role="viewer").json()
    assert status["controller"]["leader"] is True
    (node,) = status["nodes"]
    assert (node["name"], node["state"], node["engines"], node["capacity"]) == ("n1", "up", 2, {"engines": 4, "kv_mib": 1024})
    assert {e["state"] for e in status["engines"]} == {"ready", "pending"}
    ready = next(e for e in status["engines"] if e["state"] == "ready")
    assert ready["metrics"]["kv_cache_usage_perc"] == 0.25 and ready["url"] == "http://127.0.0.1:8100"
    by_name = {d["name"]: d for d in status["deployments"]}
    assert {name: (d["replicas"], d["placed"]) for name, d in by_name.items()} == {"chat-decode": (1, 1), "chat-prefill": (1, 1)}
    assert sum(d["ready"] for d in by_name.values()) == 1


def test_routing_table_follows_the_contract(api: Api) -> None:
    fleet_with_engines(api)
    table = api.call("GET", "/api/v1/routing", role="viewer").json()
    assert set(table) == {"generation", "models", "engines", "flags"}
    model = table["models"]["smollm2-135m"]
    assert model["traffic"] == {"chat@r1": 1.0} and model["pd"] is True
    assert model["classes"]["chat@r1"]["weights"] == "smollm2"
    (engine,) = table["engines"]
    assert set(engine) == {"name", "node", "model", "class_ref", "role", "url", "state", "kv_events_endpoint", "metrics",
                           "cordoned"}
    assert engine["node"] == "n1" and engine["state"] == "ready"
    assert api.call("GET", "/api/v1/routing", role="viewer").json()["generation"] == table["generation"]


def test_traffic_and_flags_reach_the_routing_table(api: Api) -> None:
    fleet_with_engines(api)
    before = api.call("GET", "/api/v1/routing", role="viewer").json()["generation"]
    r2 = apply_class(api, max_num_seqs=8)["ref"]  # a performance-only difference: the split guard allows it
    deploy(api, "chat-r2", r2, 1)  # and traffic may only go to revisions with a ready engine
    api.reconcile()
    reply = beat(api, "n1")
    beat(api, "n1", reply["generation"], [observed(a, "ready") for a in reply["assignment"]])
    set_traffic = api.call("PUT", "/api/v1/traffic/smollm2-135m", role="operator", json={"weights": {"chat@r1": 90, r2: 10}})
    assert set_traffic.status_code == 200, set_traffic.text
    assert api.call("PUT", "/api/v1/flags/prefix_routing", role="operator", json={"value": False, "reason": "t"}).status_code == 200
    table = api.call("GET", "/api/v1/routing", role="viewer").json()
    assert table["models"]["smollm2-135m"]["traffic"] == {"chat@r1": 90.0, r2: 10.0}
    assert set(table["models"]["smollm2-135m"]["classes"]) == {"chat@r1", r2}
    assert table["flags"] == {"prefix_routing": False}
    assert table["generation"] != before


def test_traffic_is_validated(api: Api) -> None:
    apply_class(api)
    apply_class(api, "other", model="other-model")
    cases = [
        ({"weights": {}}, "weights"),
        ({"weights": {"chat@r1": -1}}, "weights.chat@r1"),
        ({"weights": {"chat@r1": 0}}, "weights"),
        ({"weights": {"ghost@r1": 1}}, "weights.ghost@r1"),
        ({"weights": {"other@r1": 1}}, "weights.other@r1"),
        ({"weights": {"chat": 1}}, "weights.chat"),
    ]
    for body, field in cases:
        response = api.call("PUT", "/api/v1/traffic/smollm2-135m", role="operator", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["field"] == field
    assert api.call("GET", "/api/v1/traffic", role="viewer").json() == {}


def test_openapi_schema_is_served(api: Api) -> None:
    schema = api.http.get("/openapi.json").json()
    assert "/api/v1/agents/heartbeat" in schema["paths"]
    assert "HeartbeatRequest" in schema["components"]["schemas"]
