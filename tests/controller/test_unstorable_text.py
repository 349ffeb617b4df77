"""Strings that cannot be stored are refused on every write route, on SQLite and PostgreSQL: a NUL
(PostgreSQL's text refuses it) or an unpaired surrogate (it cannot be encoded as UTF-8), in the body, the
path or the reason header, is a 422 naming where it is, and nothing is written."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ctl_helpers import SPEC, Api, apply_class
from test_validation_api import assert_refused, row_counts

BAD = {"nul": "a\x00b", "surrogate": "a\ud800b"}

# Every mutating operation of the API: (method, path, body with BAD at `field`, role, the field named)
WRITES: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("POST", "/api/v1/agents/register", {"node": "n1", "url": "{bad}", "capacity": {"engines": 1, "kv_mib": 1}}, "agent", "url"),
    ("POST", "/api/v1/agents/heartbeat", {"node": "n1", "generation": 0, "engines": [
        {"name": "e0", "model": "{bad}", "class_ref": "chat@r1", "role": "mixed", "state": "ready"}]}, "agent", "engines.0.model"),
    ("POST", "/api/v1/classes", {"name": "chat", "spec": {**SPEC, "engine_args": {"flag": "{bad}"}}}, "operator",
     "spec.engine_args.flag"),
    ("PUT", "/api/v1/deployments/chat", {"class_ref": "chat@r1", "replicas": 1, "placement": {"zone": "{bad}"}}, "operator",
     "placement.zone"),
    ("DELETE", "/api/v1/deployments/chat", {"reason": "{bad}"}, "operator", "reason"),
    ("PUT", "/api/v1/traffic/smollm2-135m", {"weights": {"{bad}": 1}}, "operator", "weights"),
    ("PUT", "/api/v1/flags/prefix_routing", {"value": "{bad}"}, "operator", "value"),
    ("POST", "/api/v1/nodes/n1/cordon", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/nodes/n1/uncordon", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/nodes/n1/kv/flush", {"class_name": "{bad}"}, "operator", "class_name"),
    ("POST", "/api/v1/nodes/n1/drain", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/engines/chat-0/drain", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/engines/chat-0/cordon", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/engines/chat-0/uncordon", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/engines/adopt", {"url": "http://127.0.0.1:1", "model": "{bad}", "class_ref": "chat@r1"},
     "operator", "model"),
    ("POST", "/api/v1/engines/chat-0/release", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/tokens", {"name": "ci", "role": "viewer", "reason": "{bad}"}, "admin", "reason"),
    ("POST", "/api/v1/audit/runbook", {"runbook": "rb", "run_id": "r1", "event": "start", "outcome": "started",
                                       "text": "{bad}"}, "operator", "text"),
    ("DELETE", "/api/v1/tokens/ci", {"reason": "{bad}"}, "admin", "reason"),
    ("DELETE", "/api/v1/flags/prefix_routing", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/gateways/report", {"name": "gw", "url": "{bad}", "generation": 0, "table_age_s": 0}, "operator", "url"),
    ("POST", "/api/v1/rollouts", {"spec": {"model": "{bad}", "to": "chat@r1", "steps": [{"setWeight": 100}]}}, "operator",
     "spec.model"),
    ("POST", "/api/v1/rollouts/1/abort", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/drills/misroute", {"model": "{bad}", "to": "chat@r1", "fraction": 0.1}, "operator", "model"),
    ("POST", "/api/v1/drills/plant", {"engine": "chat-0", "fault": "{bad}"}, "operator", "fault"),
    ("POST", "/api/v1/drills/1/stop", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/drills/stop", {"reason": "{bad}"}, "operator", "reason"),
    ("POST", "/api/v1/canary/golden-sets", {"golden_set": {"name": "g", "version": 1, "model": "smollm2-135m",
                                                           "prompts": [{"id": "p", "prompt": "{bad}"}]}},
     "operator", "golden_set.prompts.0.prompt"),
    ("POST", "/api/v1/canary/references", {"reference": {"golden_set": "{bad}"}}, "operator", "reference.golden_set"),
    ("POST", "/api/v1/breakglass/freeze", {"reason": "{bad}"}, "admin", "reason"),
    ("POST", "/api/v1/breakglass/unfreeze", {"reason": "{bad}"}, "admin", "reason"),
    ("POST", "/api/v1/breakglass/pin/smollm2-135m", {"class_ref": "chat@r1", "reason": "{bad}"}, "admin", "reason"),
    ("DELETE", "/api/v1/breakglass/pin/smollm2-135m", {"reason": "{bad}"}, "admin", "reason"),
    ("POST", "/api/v1/breakglass/shed/smollm2-135m", {"fraction": 0.5, "reason": "{bad}"}, "admin", "reason"),
    ("POST", "/api/v1/breakglass/kill-switch/prefix_routing", {"reason": "{bad}"}, "admin", "reason"),
    ("POST", "/api/v1/breakglass/direct-actions", {"kind": "agent", "source": "n1", "actions": [
        {"seq": 1, "at": 0, "action": "drain", "target": "chat-0", "reason": "{bad}"}]}, "agent", "actions.0.reason"),
    ("POST", "/api/v1/breakglass/reconcile", {"adopt": [1], "reason": "{bad}"}, "admin", "reason"),
    ("POST", "/api/v1/pd/models/smollm2-135m/rebalance", {"prefill": 1, "decode": 1, "reason": "{bad}"}, "operator",
     "reason"),
    ("POST", "/api/v1/pd/rebalances/1/stop", {"reason": "{bad}"}, "operator", "reason"),
    ("PUT", "/api/v1/pd/models/smollm2-135m/settings", {"mode": "auto", "reason": "{bad}"}, "operator", "reason"),
    ("PUT", "/api/v1/pd/profiles/chat@r1", {"prefill_tokens_per_s": 1, "decode_slots": 1, "detail": {"k": "{bad}"}},
     "operator", "detail.k"),
]


def with_bad(body: dict[str, Any], bad: str) -> bytes:
    # json.dumps escapes the NUL and the surrogate as \u0000 and \ud800: what a client would send
    return json.dumps(body).replace("{bad}", json.dumps(bad)[1:-1]).encode()


def test_the_table_covers_every_mutating_operation(api: Api) -> None:
    schema = api.http.get("/openapi.json").json()
    mutating = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops
                if method in ("post", "put", "patch", "delete")}
    covered = {(method, _template(path)) for method, path, *_ in WRITES}
    assert mutating == covered


def _template(path: str) -> str:
    parts = {"/api/v1/deployments/chat": "/api/v1/deployments/{name}", "/api/v1/traffic/smollm2-135m": "/api/v1/traffic/{model}",
             "/api/v1/flags/prefix_routing": "/api/v1/flags/{key}", "/api/v1/tokens/ci": "/api/v1/tokens/{name}",
             "/api/v1/engines/chat-0/drain": "/api/v1/engines/{name}/drain",
             "/api/v1/rollouts/1/abort": "/api/v1/rollouts/{rollout_id}/{command}",
             "/api/v1/drills/1/stop": "/api/v1/drills/{drill_id}/stop",
             "/api/v1/breakglass/pin/smollm2-135m": "/api/v1/breakglass/pin/{model}",
             "/api/v1/breakglass/shed/smollm2-135m": "/api/v1/breakglass/shed/{model}",
             "/api/v1/breakglass/kill-switch/prefix_routing": "/api/v1/breakglass/kill-switch/{flag}",
             "/api/v1/pd/models/smollm2-135m/rebalance": "/api/v1/pd/models/{model}/rebalance",
             "/api/v1/pd/rebalances/1/stop": "/api/v1/pd/rebalances/{rebalance_id}/stop",
             "/api/v1/pd/models/smollm2-135m/settings": "/api/v1/pd/models/{model}/settings",
             "/api/v1/pd/profiles/chat@r1": "/api/v1/pd/profiles/{class_ref}"}
    if path in parts:
        return parts[path]
    return path.replace("/nodes/n1/", "/nodes/{name}/").replace("/engines/chat-0/", "/engines/{name}/")


@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize(("method", "path", "body", "role", "field"), WRITES, ids=[f"{m} {p}" for m, p, *_ in WRITES])
def test_unstorable_text_in_a_body_is_refused_naming_the_field(api: Api, kind: str, method: str, path: str,
                                                               body: dict[str, Any], role: str, field: str) -> None:
    apply_class(api)
    before = row_counts(api)
    response = api.call(method, path, role=role, content=with_bad(body, BAD[kind]),
                        headers={"content-type": "application/json"})
    assert_refused(api, response, 422, field, before)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_unstorable_text_in_the_path_or_the_reason_header_is_refused(api: Api, kind: str) -> None:
    before = row_counts(api)
    encoded = "%00" if kind == "nul" else "%ED%A0%80"  # U+D800 as (invalid) UTF-8
    assert_refused(api, api.call("PUT", f"/api/v1/traffic/m{encoded}", role="operator", json={"weights": {"chat@r1": 1}}),
                   422, "path", before)
    assert_refused(api, api.call("PUT", "/api/v1/flags/prefix_routing", role="operator", json={"value": True},
                                 headers={"X-Fleet-Reason": f"why{encoded}"}), 422, "X-Fleet-Reason", before)
    assert api.call("GET", "/api/v1/audit", role="viewer").status_code == 200  # the refusals were recorded


def test_a_value_no_member_of_a_union_accepts_names_the_field(api: Api) -> None:
    response = api.call("PUT", "/api/v1/flags/prefix_routing", role="operator", content=b'{"value": [1]}',
                        headers={"content-type": "application/json"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["field"] == "value" and "accepted forms" in error["message"]
