"""The audit log: ok, noop and refused mutations are each one event with actor, action, target, reason,
payload digest, result and time; reads are not audited; there is no way to change the log."""

from __future__ import annotations

import hashlib
import json

from ctl_helpers import SPEC, Api, apply_class

from fleetctl.controller.audit import payload_digest


def events(api: Api, **params: str) -> list[dict]:
    response = api.call("GET", "/api/v1/audit", role="viewer", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_ok_noop_and_refused_mutations_are_recorded(api: Api) -> None:
    operator = api.tokens["operator"]
    body = {"name": "chat", "spec": SPEC, "reason": "first class"}
    api.call("POST", "/api/v1/classes", role="operator", json=body)
    api.call("POST", "/api/v1/classes", role="operator", json=body)
    api.call("POST", "/api/v1/classes", role="viewer", json=body)
    api.call("PUT", "/api/v1/deployments/chat", role="operator", json={"class_ref": "ghost@r1", "replicas": 1},
             headers={"X-Fleet-Reason": "try%20%C3%BC"})
    api.call("GET", "/api/v1/classes", role="viewer")  # reads are not audited
    log = events(api)
    assert [(e["action"], e["target"], e["result"], e["code"], e["status"]) for e in log] == [
        ("class.apply", "chat@r1", "ok", None, 201),
        ("class.apply", "chat@r1", "noop", None, 200),
        ("class.apply", "chat", "refused", "forbidden", 403),
        ("deployment.set", "chat", "refused", "unknown_class", 422),
    ]
    assert log[0]["reason"] == "first class" and log[3]["reason"] == "try ü"
    assert log[0]["actor"].startswith("test-operator-") and log[2]["actor"].startswith("test-viewer-")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert log[0]["payload_digest"] == hashlib.sha256(canonical).hexdigest()
    assert all(operator not in json.dumps(e) for e in log)


def test_filters_by_actor_and_since(api: Api) -> None:
    apply_class(api)
    api.clock.advance(3600)
    api.call("POST", "/api/v1/tokens", role="admin", json={"name": "later", "role": "viewer"})
    assert [e["action"] for e in events(api, since="30m")] == ["token.create"]
    assert [e["action"] for e in events(api, since=(api.clock.now.replace(minute=0)).isoformat())] == ["token.create"]
    operator_events = events(api, actor=events(api)[0]["actor"])
    assert [e["action"] for e in operator_events] == ["class.apply"]
    bad = api.call("GET", "/api/v1/audit", role="viewer", params={"since": "yesterday"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "since"


def test_the_log_cannot_be_changed(api: Api) -> None:
    apply_class(api)
    for method in ("PUT", "PATCH", "DELETE", "POST"):
        assert api.call(method, "/api/v1/audit", role="admin").status_code == 405
    assert len(events(api)) == 1


def test_unauthenticated_mutation_is_recorded_without_the_token(api: Api) -> None:
    api.call("POST", "/api/v1/nodes/n1/cordon", role=None, headers={"Authorization": "Bearer fleet_guess"})
    (event,) = events(api)
    assert (event["actor"], event["action"], event["target"], event["result"], event["status"]) == (
        "unauthenticated", "node.cordon", "n1", "refused", 401)


def test_payload_digest_is_canonical() -> None:
    assert payload_digest(b'{"b": 1, "a": [1, 2]}') == payload_digest(b'{"a":[1,2],"b":1}')
    assert payload_digest(b"not json") == hashlib.sha256(b"not json").hexdigest()
