"""PUT/GET /api/v1/traffic/{model} with the split guard, on SQLite and PostgreSQL: refused splits store
nothing and are audited as refused; allowed correctness changes are stored and audited with the marker
and the differing fields; traffic goes only to revisions with ready engines; the returned generation is
the routing table's."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api, apply_class, beat, deploy, observed, register

from fleetctl.controller.models import AdoptedEngine, Node

MODEL = "smollm2-135m"


def serve(api: Api, node: str, *refs: str) -> None:
    """One deployment per revision, each engine reported ready by `node`'s agent."""
    for ref in refs:
        deploy(api, ref.replace("@", "-"), ref, 1)
    api.reconcile()
    reply = beat(api, node)
    beat(api, node, reply["generation"], [observed(a, "ready") for a in reply["assignment"]])


def two_revisions(api: Api, **r2: Any) -> tuple[str, str]:
    register(api, "n1")
    r1 = apply_class(api)["ref"]
    second = apply_class(api, **r2)["ref"]
    serve(api, "n1", r1, second)
    return r1, second


def put(api: Api, weights: dict[str, float], **body: Any) -> Any:
    return api.call("PUT", f"/api/v1/traffic/{MODEL}", role="operator", json={"weights": weights, **body})


def audit(api: Api) -> list[dict[str, Any]]:
    return [e for e in api.call("GET", "/api/v1/audit", role="viewer").json() if e["action"] == "traffic.set"]


def routing(api: Api) -> dict[str, Any]:
    return api.call("GET", "/api/v1/routing", role="viewer").json()


def test_a_correctness_split_is_refused_stores_nothing_and_is_audited(api: Api) -> None:
    r1, r2 = two_revisions(api, max_model_len=8192, sampler="approximate_topk")
    before = routing(api)
    response = put(api, {r1: 90, r2: 10}, reason="try a split")
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error == {
        "code": "correctness_split_refused", "field": "weights.chat@r2",
        "message": "chat@r1 and chat@r2 differ in correctness fields: max_model_len 2048 -> 8192, "
                   "sampler exact -> approximate_topk; pass allow_correctness_change to split traffic anyway",
    }
    assert api.call("GET", "/api/v1/traffic", role="viewer").json() == {}
    assert routing(api) == before  # same content, same generation
    (event,) = audit(api)
    assert (event["result"], event["code"], event["status"], event["target"], event["reason"]) == (
        "refused", "correctness_split_refused", 409, MODEL, "try a split")


def test_an_allowed_correctness_change_is_stored_and_audited_with_the_marker(api: Api) -> None:
    r1, r2 = two_revisions(api, max_model_len=8192)
    response = put(api, {r1: 90, r2: 10}, allow_correctness_change=True, reason="long-context canary")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["result"] == "changed" and body["correctness_change_allowed"] is True
    assert body["correctness_differences"] == [
        {"between": [r1, r2], "fields": [{"field": "max_model_len", "first": 2048, "second": 8192}]}]
    table = routing(api)
    assert table["models"][MODEL]["traffic"] == {r1: 90.0, r2: 10.0}
    assert table["generation"] == body["generation"]
    (event,) = audit(api)
    assert (event["result"], event["code"], event["status"], event["reason"]) == (
        "ok", "correctness_change_allowed", 200, "long-context canary")
    assert event["detail"] == {"allow_correctness_change": True, "correctness_differences": body["correctness_differences"]}


def test_a_performance_only_split_needs_no_flag_and_carries_no_marker(api: Api) -> None:
    r1, r2 = two_revisions(api, max_num_seqs=8)
    response = put(api, {r1: 50, r2: 50})
    assert response.status_code == 200, response.text
    assert response.json()["correctness_change_allowed"] is False
    (event,) = audit(api)
    assert (event["result"], event["code"], event["detail"]) == ("ok", None, None)


def test_a_cutover_to_a_differing_revision_is_not_a_split(api: Api) -> None:
    r1, r2 = two_revisions(api, dtype="bfloat16")
    assert put(api, {r1: 0, r2: 100}).status_code == 200
    assert put(api, {r1: 1}).status_code == 200  # and back


def test_traffic_goes_only_to_revisions_with_ready_engines(api: Api) -> None:
    register(api, "n1")
    r1 = apply_class(api)["ref"]
    r2 = apply_class(api, max_num_seqs=8)["ref"]
    refused = put(api, {r1: 1})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "no_ready_engines"
    assert refused.json()["error"]["field"] == f"weights.{r1}"
    serve(api, "n1", r1)
    assert put(api, {r1: 1, r2: 0}).status_code == 200  # zero weight: no engine needed
    refused = put(api, {r1: 1, r2: 1})
    assert (refused.status_code, refused.json()["error"]["field"]) == (409, f"weights.{r2}")
    assert [e["code"] for e in audit(api)] == ["no_ready_engines", None, "no_ready_engines"]


def test_engines_on_down_nodes_or_being_drained_are_not_ready(api: Api) -> None:
    register(api, "n1")
    r1 = apply_class(api)["ref"]
    serve(api, "n1", r1)
    assert put(api, {r1: 1}).status_code == 200
    api.clock.advance(60)
    api.reconcile()  # no heartbeat for 60 s: n1 is marked down, its engines keep their last state
    with api.runtime.store.session() as session:
        assert session.get(Node, "n1").state == "down"
    assert put(api, {r1: 2}).json()["error"]["code"] == "no_ready_engines"
    serve(api, "n1", r1)  # it heartbeats again
    assert put(api, {r1: 2}).status_code == 200
    api.call("POST", "/api/v1/nodes/n1/drain", role="operator")
    assert put(api, {r1: 3}).json()["error"]["code"] == "no_ready_engines"


def test_invalid_weights_are_422_and_store_nothing(api: Api) -> None:
    r1, _ = two_revisions(api, max_num_seqs=8)
    for weights, field in [({r1: -1}, f"weights.{r1}"), ({"ghost@r1": 1}, "weights.ghost@r1"), ({r1: 0}, "weights")]:
        response = put(api, weights)
        assert (response.status_code, response.json()["error"]["field"]) == (422, field), response.text
    assert put(api, {r1: 1}, allow_correctness_change="maybe").status_code == 422
    assert api.call("GET", "/api/v1/traffic", role="viewer").json() == {}


def test_the_returned_generation_is_the_routing_tables_and_only_grows(api: Api) -> None:
    r1, r2 = two_revisions(api, max_num_seqs=8)
    start = routing(api)["generation"]
    first = put(api, {r1: 90, r2: 10}).json()
    assert first["generation"] > start and routing(api)["generation"] == first["generation"]
    again = put(api, {r1: 90, r2: 10}).json()
    assert (again["result"], again["generation"]) == ("unchanged", first["generation"])
    second = put(api, {r1: 10, r2: 90}).json()
    assert second["generation"] > first["generation"]
    back = put(api, {r1: 90, r2: 10}).json()  # the first content again: still a later generation
    assert back["generation"] > second["generation"]
    table = routing(api)
    assert (table["generation"], table["models"][MODEL]["traffic"]) == (back["generation"], {r1: 90.0, r2: 10.0})


def test_get_traffic_shows_weights_ready_engines_and_correctness_fields(api: Api) -> None:
    r1, r2 = two_revisions(api, max_model_len=8192)
    fallback = api.call("GET", f"/api/v1/traffic/{MODEL}", role="viewer").json()
    assert (fallback["source"], fallback["weights"]) == ("deployments", {r1: 1.0, r2: 1.0})
    put(api, {r1: 3, r2: 1}, allow_correctness_change=True)
    view = api.call("GET", f"/api/v1/traffic/{MODEL}", role="viewer").json()
    assert (view["source"], view["weights"], view["updated_by"].startswith("test-operator-")) == (
        "policy", {r1: 3.0, r2: 1.0}, True)
    assert [(r["ref"], r["weight"], r["share"], r["ready_engines"]) for r in view["revisions"]] == [
        (r1, 3.0, 0.75, 1), (r2, 1.0, 0.25, 1)]
    assert view["revisions"][1]["correctness"]["max_model_len"] == 8192
    assert "max_num_seqs" not in view["revisions"][1]["correctness"]
    missing = api.call("GET", "/api/v1/traffic/no-such-model", role="viewer")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def adopt_row(api: Api, ref: str, state: str = "ready") -> None:
    """An adopted engine of `ref` as `engine adopt` stores it (adoption itself is tested against a live engine
    in tests/gateway/test_engine_adoption_process.py)."""
    now = api.clock()
    with api.runtime.store.session() as session:
        session.add(AdoptedEngine(name="vllm-a", url="http://10.0.0.9:8000", model=MODEL, class_ref=ref, role="mixed",
                                  kv_events_endpoint=None, state=state, metrics={}, reported=None, last_error=None,
                                  adopted_at=now, adopted_by="admin", checked_at=now, draining_since=None))


def test_a_revision_served_by_adopted_engines_takes_and_gives_up_traffic(api: Api) -> None:
    register(api, "n1")
    r1 = apply_class(api)["ref"]
    r2 = apply_class(api, max_num_seqs=8)["ref"]
    serve(api, "n1", r1)
    adopt_row(api, r2)
    view = api.call("GET", f"/api/v1/traffic/{MODEL}", role="viewer").json()
    assert {r["ref"]: r["ready_engines"] for r in view["revisions"]} == {r1: 1, r2: 1}
    assert view["weights"] == {r1: 1.0, r2: 1.0}  # no policy: every deployed or adopted revision, as routing has it
    assert put(api, {r1: 1, r2: 3}).status_code == 200  # a rollout's split onto the adopted revision
    assert put(api, {r1: 1, r2: 0}).status_code == 200  # and off it
    with api.runtime.store.session() as session:
        session.get(AdoptedEngine, "vllm-a").state = "draining"  # released: no new traffic
    refused = put(api, {r1: 1, r2: 1})
    assert (refused.status_code, refused.json()["error"]["field"]) == (409, f"weights.{r2}")
