"""Direct actions through the controller's API, on SQLite and PostgreSQL: a node's upload is stored once and
audited under `direct:NODE`; an action still in force that desired state does not agree with is a
divergence, kept until an admin adopts or reverts it (with a reason; refusals audited); the node learns the
resolution in its next upload's reply; one desired state already agrees with settles itself."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api
from rollout_helpers import MODEL, R1, served_by_r1

WHY = {"reason": "the controller was down"}


def action(seq: int, name: str, target: str, value: Any = None) -> dict[str, Any]:
    return {"seq": seq, "at": 1_767_225_600.0 + seq, "action": name, "target": target, "value": value,
            "reason": "incident", "client": "127.0.0.1"}


def upload(api: Api, kind: str, source: str, actions: list[dict[str, Any]], open_seqs: list[int],
           role: str | None = None) -> Any:
    body = {"kind": kind, "source": source, "actions": actions, "open": open_seqs}
    return api.call("POST", "/api/v1/breakglass/direct-actions", role=role or ("agent" if kind == "agent" else "viewer"),
                    json=body)


def divergence(api: Api, everything: bool = False) -> list[dict[str, Any]]:
    response = api.call("GET", "/api/v1/breakglass/divergence" + ("?all=true" if everything else ""), role="viewer")
    assert response.status_code == 200, response.text
    return response.json()


def reconcile(api: Api, role: str = "admin", **body: Any) -> Any:
    return api.call("POST", "/api/v1/breakglass/reconcile", role=role, json={**WHY, **body})


def direct_audit(api: Api) -> list[tuple[str, str, str]]:
    return [(e["actor"], e["action"], e["target"]) for e in api.call("GET", "/api/v1/audit", role="viewer").json()
            if e["actor"].startswith("direct:")]


def engine_of(api: Api) -> str:
    return api.call("GET", "/api/v1/engines", role="viewer").json()[0]["name"]


def test_an_upload_is_stored_once_and_audited_under_the_node(api: Api) -> None:
    served_by_r1(api)
    engine = engine_of(api)
    drain, restart = action(1, "drain", engine), action(2, "restart", engine)
    first = upload(api, "agent", "n1", [drain], [1])
    assert first.status_code == 200 and first.json() == {"acknowledged": 1, "resolved": {}}, first.text
    again = upload(api, "agent", "n1", [drain, restart], [])  # a retried upload resends what was stored
    assert again.json()["acknowledged"] == 2
    assert direct_audit(api) == [("direct:n1", "direct.drain", f"n1/{engine}"), ("direct:n1", "direct.restart", f"n1/{engine}")]
    everything = divergence(api, everything=True)
    assert [(d["action"], d["state"]) for d in everything] == [("drain", "done"), ("restart", "done")]
    assert divergence(api) == []  # the restart lifted the drain: nothing is held any more


def test_an_agent_upload_needs_an_agent_token(api: Api) -> None:
    refused = upload(api, "agent", "n1", [action(1, "drain", "chat-0")], [1], role="viewer")
    assert refused.status_code == 403
    assert direct_audit(api) == []


def test_a_drain_held_by_the_agent_is_a_divergence_until_reverted(api: Api) -> None:
    served_by_r1(api)
    engine = engine_of(api)
    upload(api, "agent", "n1", [action(1, "drain", engine)], [1])
    (held,) = divergence(api)
    assert (held["kind"], held["source"], held["target"], held["desired"], held["state"]) == ("agent", "n1", engine, "run", "pending")
    api.reconcile()
    assert divergence(api) == [held]  # the reconciler reports it, it does not undo it
    assert upload(api, "agent", "n1", [], [1]).json()["resolved"] == {}

    assert reconcile(api, role="operator", revert=[held["id"]]).status_code == 403
    no_reason = api.call("POST", "/api/v1/breakglass/reconcile", role="admin", json={"revert": [held["id"]]})
    assert no_reason.status_code == 422 and no_reason.json()["error"]["field"] == "reason"
    reverted = reconcile(api, revert=[held["id"]])
    assert reverted.status_code == 200 and reverted.json()["reverted"] == [held["id"]], reverted.text
    assert upload(api, "agent", "n1", [], [1]).json()["resolved"] == {"1": "reverted"}
    assert divergence(api) == []
    results = [(e["action"], e["result"], e["status"]) for e in api.call("GET", "/api/v1/audit", role="viewer").json()
               if e["action"] == "breakglass.reconcile"]
    assert results == [("breakglass.reconcile", "refused", 403), ("breakglass.reconcile", "refused", 422),
                       ("breakglass.reconcile", "ok", 200)]


def test_adopting_a_drain_drains_the_engine_in_desired_state(api: Api) -> None:
    served_by_r1(api)
    engine = engine_of(api)
    upload(api, "agent", "n1", [action(1, "stop", engine)], [1])
    (held,) = divergence(api)
    assert reconcile(api, adopt=[held["id"]]).status_code == 200
    assert upload(api, "agent", "n1", [], [1]).json()["resolved"] == {"1": "adopted"}
    assignment = next(e for e in api.call("GET", "/api/v1/engines", role="viewer").json() if e["name"] == engine)
    assert assignment["drain"] is True


def test_adopting_a_gateway_pin_sets_it_centrally_and_the_gateway_drops_its_own(api: Api) -> None:
    served_by_r1(api)
    upload(api, "gateway", "gw-a", [action(1, "flag.set", f"pin:{MODEL}", R1)], [1])
    (pin,) = divergence(api)
    assert (pin["target"], pin["value"], pin["desired"]) == (f"pin:{MODEL}", R1, None)
    adopted = reconcile(api, adopt=[pin["id"]])
    assert adopted.status_code == 200 and adopted.json()["generation"] is not None
    assert api.call("GET", "/api/v1/routing", role="viewer").json()["flags"] == {f"pin:{MODEL}": R1}
    assert upload(api, "gateway", "gw-a", [], [1]).json()["resolved"] == {"1": "adopted"}
    again = reconcile(api, revert=[pin["id"]])
    assert again.status_code == 422 and again.json()["error"]["field"] == "ids"


def test_a_local_override_desired_state_already_has_settles_itself(api: Api) -> None:
    served_by_r1(api)
    assert api.call("PUT", "/api/v1/flags/shed_fraction:" + MODEL, role="operator", json={"value": 0.5, **WHY}).status_code == 200
    reply = upload(api, "gateway", "gw-a", [action(1, "flag.set", f"shed_fraction:{MODEL}", 0.5)], [1])
    assert reply.json()["resolved"] == {"1": "matches"}
    assert divergence(api) == []


def test_reconcile_refuses_unknown_ids_and_empty_requests_writing_nothing(api: Api) -> None:
    unknown = reconcile(api, adopt=[99])
    assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "ids"
    empty = reconcile(api)
    assert empty.status_code == 422 and empty.json()["error"]["field"] == "adopt"
    both = reconcile(api, adopt=[1], revert=[1])
    assert both.status_code == 422 and both.json()["error"]["field"] == "revert"
    assert api.call("GET", "/api/v1/routing", role="viewer").json()["flags"] == {}
