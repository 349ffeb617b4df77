"""Bad input is refused before anything is stored: a 422 (or 413) naming the field, nothing written
except the audit event of the refusal."""

from __future__ import annotations

import json

from typing import Any

import pytest
from ctl_helpers import SPEC, Api, apply_class
from sqlalchemy import func, select

from fleetctl.controller.models import AuditEvent, Base

BAD_CLASSES = [
    ({"spec": SPEC}, "name"),
    ({"name": "", "spec": SPEC}, "name"),
    ({"name": "Chat_1", "spec": SPEC}, "name"),
    ({"name": "chat"}, "spec"),
    ({"name": "chat", "spec": {"weights": "smollm2"}}, "spec.model"),
    ({"name": "chat", "spec": {**SPEC, "model": "   "}}, "spec.model"),
    ({"name": "chat", "spec": {**SPEC, "weights_revision": ""}}, "spec.weights_revision"),
    ({"name": "chat", "spec": {**SPEC, "max_model_len": "long"}}, "spec.max_model_len"),
    ({"name": "chat", "spec": {**SPEC, "max_model_len": -1}}, "spec.max_model_len"),
    ({"name": "chat", "spec": {**SPEC, "dtype": "int3"}}, "spec.dtype"),
    ({"name": "chat", "spec": {**SPEC, "tokenizer_typo": "x"}}, "spec.tokenizer_typo"),
    ({"name": "chat", "spec": {**SPEC, "weights": "llama"}}, "spec.weights"),
    ({"name": 7, "spec": SPEC}, "name"),
    ([1, 2], "body"),
]

BAD_DEPLOYMENTS = [
    ("chat", {"replicas": 1}, "class_ref"),
    ("chat", {"class_ref": "", "replicas": 1}, "class_ref"),
    ("chat", {"class_ref": "ghost@r1", "replicas": 1}, "class_ref"),
    ("chat", {"class_ref": "chat@r7", "replicas": 1}, "class_ref"),
    ("chat", {"class_ref": "chat@x", "replicas": 1}, "class_ref"),
    ("chat", {"class_ref": "chat@r1", "replicas": -1}, "replicas"),
    ("chat", {"class_ref": "chat@r1", "replicas": "two"}, "replicas"),
    ("chat", {"class_ref": "chat@r1"}, "replicas"),
    ("chat", {"class_ref": "chat@r1", "replicas": 1, "role": "both"}, "role"),
    ("chat", {"class_ref": "chat@r1", "replicas": 1, "model": "other-model"}, "model"),
    ("chat", {"class_ref": "chat@r1", "replicas": 1, "placement": {"bad key!": "x"}}, "placement"),
    ("chat", {"class_ref": "chat@r1", "replicas": 1, "placement": {"gpu": 1}}, "placement.gpu"),
    ("Bad_Name", {"class_ref": "chat@r1", "replicas": 1}, "name"),
]

BAD_AGENT_CALLS = [
    ("/api/v1/agents/register", {"url": "http://x", "capacity": {"engines": 1, "kv_mib": 1}}, "node"),
    ("/api/v1/agents/register", {"node": "n1", "url": " ", "capacity": {"engines": 1, "kv_mib": 1}}, "url"),
    ("/api/v1/agents/register", {"node": "n1", "url": "http://x", "capacity": {"engines": -1, "kv_mib": 1}}, "capacity.engines"),
    ("/api/v1/agents/register", {"node": "n1", "url": "http://x"}, "capacity"),
    ("/api/v1/agents/heartbeat", {"node": "n1"}, "generation"),
    ("/api/v1/agents/heartbeat", {"node": "n1", "generation": 0, "engines": [{"name": "e"}]}, "engines.0.model"),
]


def row_counts(api: Api) -> dict[str, int]:
    with api.runtime.store.session() as session:
        return {name: session.execute(select(func.count()).select_from(table)).scalar_one()
                for name, table in Base.metadata.tables.items() if name not in ("audit_events", "api_tokens")}


def audit_count(api: Api) -> int:
    with api.runtime.store.session() as session:
        return session.execute(select(func.count()).select_from(AuditEvent)).scalar_one()


def assert_refused(api: Api, response: Any, status: int, field: str, before: dict[str, int]) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field
    assert error["message"].startswith(f"{field}:") or field == "body"
    assert row_counts(api) == before


@pytest.mark.parametrize(("body", "field"), BAD_CLASSES)
def test_bad_class_is_refused_naming_the_field(api: Api, body: Any, field: str) -> None:
    before, audited = row_counts(api), audit_count(api)
    response = api.call("POST", "/api/v1/classes", role="operator", json=body)
    assert_refused(api, response, 422, field, before)
    assert audit_count(api) == audited + 1


@pytest.mark.parametrize(("name", "body", "field"), BAD_DEPLOYMENTS)
def test_bad_deployment_is_refused_naming_the_field(api: Api, name: str, body: dict[str, Any], field: str) -> None:
    apply_class(api)
    before = row_counts(api)
    response = api.call("PUT", f"/api/v1/deployments/{name}", role="operator", json=body)
    assert_refused(api, response, 422, field, before)


def test_unknown_class_has_its_own_code(api: Api) -> None:
    response = api.call("PUT", "/api/v1/deployments/chat", role="operator", json={"class_ref": "ghost@r1", "replicas": 1})
    assert response.json()["error"]["code"] == "unknown_class"


@pytest.mark.parametrize(("path", "body", "field"), BAD_AGENT_CALLS)
def test_bad_agent_calls_are_refused_naming_the_field(api: Api, path: str, body: dict[str, Any], field: str) -> None:
    before = row_counts(api)
    assert_refused(api, api.call("POST", path, role="agent", json=body), 422, field, before)


def test_not_json_is_refused(api: Api) -> None:
    before = row_counts(api)
    response = api.call("POST", "/api/v1/classes", role="operator", content=b"{not json",
                        headers={"content-type": "application/json"})
    assert_refused(api, response, 422, "body", before)


@pytest.mark.parametrize("declared", [True, False])
def test_oversize_body_is_413_and_audited(api: Api, declared: bool) -> None:
    before, audited = row_counts(api), audit_count(api)
    big = b'{"name": "chat", "spec": {"model": "' + b"x" * (1024 * 1024) + b'"}}'
    if declared:
        response = api.call("POST", "/api/v1/classes", role="operator", content=big, headers={"content-type": "application/json"})
    else:  # chunked, no content-length: the limit is enforced while reading
        response = api.call("POST", "/api/v1/classes", role="operator", content=iter([big[:1000], big[1000:]]),
                            headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"] == {"code": "payload_too_large", "message": "body: larger than 1048576 bytes", "field": "body"}
    assert row_counts(api) == before
    assert audit_count(api) == audited + 1
    event = api.call("GET", "/api/v1/audit", role="viewer").json()[-1]
    assert (event["action"], event["result"], event["status"]) == ("class.apply", "refused", 413)


def test_a_body_just_under_the_limit_is_read(api: Api) -> None:
    body = json.dumps({"name": "chat", "spec": SPEC})
    padded = body + " " * (1024 * 1024 - 200 - len(body))  # no field may be that long: JSON whitespace
    response = api.call("POST", "/api/v1/classes", role="operator", content=padded.encode(),
                        headers={"content-type": "application/json"})
    assert response.status_code == 201
