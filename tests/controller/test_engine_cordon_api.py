"""POST /api/v1/engines/{name}/cordon|uncordon on SQLite and PostgreSQL: a cordoned engine stays assigned and
running but is marked in the routing table (a new generation) and counts as no ready engine of its revision;
the last routable engine of a revision with traffic is refused and nothing changes; every change and
refusal is audited."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api, apply_class, beat, deploy, observed, register

MODEL = "smollm2-135m"


def two_engines(api: Api) -> tuple[str, list[str]]:
    """One revision, two engines on n1, both reported ready; traffic goes to it (the deployed revision)."""
    register(api, "n1")
    ref = apply_class(api)["ref"]
    deploy(api, "chat", ref, 2)
    api.reconcile()
    reply = beat(api, "n1")
    beat(api, "n1", reply["generation"], [observed(a, "ready") for a in reply["assignment"]])
    return ref, sorted(a["name"] for a in reply["assignment"])


def cordon(api: Api, name: str, verb: str = "cordon", role: str = "operator") -> Any:
    return api.call("POST", f"/api/v1/engines/{name}/{verb}", role=role,
                    headers={"X-Fleet-Reason": "suspect%20answers"})


def routing(api: Api) -> dict[str, Any]:
    return api.call("GET", "/api/v1/routing", role="viewer").json()


def ready_engines(api: Api, ref: str) -> int:
    view = api.call("GET", f"/api/v1/traffic/{MODEL}", role="viewer").json()
    return next(r["ready_engines"] for r in view["revisions"] if r["ref"] == ref)


def audit(api: Api, action: str) -> list[dict[str, Any]]:
    return [e for e in api.call("GET", "/api/v1/audit", role="viewer").json() if e["action"] == action]


def test_a_cordoned_engine_is_marked_in_the_routing_table_and_counts_as_not_ready(api: Api) -> None:
    ref, (first, second) = two_engines(api)
    before = routing(api)
    response = cordon(api, first)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["name"], body["cordoned"], body["result"], body["state"]) == (first, True, "changed", "ready")
    table = routing(api)
    assert body["generation"] == table["generation"] > before["generation"]
    assert {e["name"]: e["cordoned"] for e in table["engines"]} == {first: True, second: False}
    assert ready_engines(api, ref) == 1
    assert api.call("GET", f"/api/v1/engines/{first}", role="viewer").json()["cordoned"] is True
    # it stays assigned: no replacement is placed
    api.reconcile()
    engines = api.call("GET", "/api/v1/engines", role="viewer").json()
    assert sorted((e["name"], e["deployment"]) for e in engines) == [(first, "chat"), (second, "chat")]
    again = cordon(api, first).json()
    assert again["result"] == "unchanged" and again["generation"] == table["generation"]
    (event, repeat) = audit(api, "engine.cordon")
    assert (event["target"], event["result"], event["reason"]) == (first, "ok", "suspect answers")
    assert repeat["result"] == "noop"


def test_uncordon_returns_it_to_traffic(api: Api) -> None:
    ref, (first, _second) = two_engines(api)
    cordon(api, first)
    response = cordon(api, first, "uncordon")
    assert response.status_code == 200 and response.json()["cordoned"] is False
    assert response.json()["generation"] == routing(api)["generation"]
    assert ready_engines(api, ref) == 2
    assert [e["result"] for e in audit(api, "engine.uncordon")] == ["ok"]


def test_the_last_routable_engine_of_a_revision_with_traffic_is_refused_and_nothing_changes(api: Api) -> None:
    ref, (first, second) = two_engines(api)
    assert cordon(api, first).status_code == 200
    before = routing(api)
    response = cordon(api, second)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("no_ready_engines", "engine")
    assert f"engine {second} is the last routable engine of {ref}" in error["message"]
    assert routing(api) == before and ready_engines(api, ref) == 1
    assert [e["result"] for e in audit(api, "engine.cordon")] == ["ok", "refused"]


def test_the_only_engine_of_a_revision_without_traffic_may_be_cordoned(api: Api) -> None:
    register(api, "n1")
    live, idle = apply_class(api)["ref"], apply_class(api, name="spare")["ref"]
    for name, ref in (("chat", live), ("spare", idle)):
        deploy(api, name, ref, 1)
    api.reconcile()
    reply = beat(api, "n1")
    beat(api, "n1", reply["generation"], [observed(a, "ready") for a in reply["assignment"]])
    assert api.call("PUT", f"/api/v1/traffic/{MODEL}", role="operator",
                    json={"weights": {live: 100, idle: 0}}).status_code == 200
    (spare,) = [a["name"] for a in reply["assignment"] if a["class_ref"] == idle]
    (chat,) = [a["name"] for a in reply["assignment"] if a["class_ref"] == live]
    assert cordon(api, spare).status_code == 200  # weight 0: no traffic moves
    assert cordon(api, chat).status_code == 409  # weight 100: it would leave the traffic nowhere to go


def test_unknown_engine_and_viewer_token_are_refused(api: Api) -> None:
    _ref, (first, _second) = two_engines(api)
    missing = cordon(api, "nope-0")
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "engine"
    assert cordon(api, first, role="viewer").status_code == 403
    assert routing(api)["engines"][0]["cordoned"] is False
