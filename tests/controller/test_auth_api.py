"""Auth, table-driven: each role allowed and refused where it should be; 401 for missing/unknown/revoked
tokens; 403 names the role required; the bootstrap token works."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import SPEC, Api, apply_class, beat, deploy, observed, register
from fastapi.testclient import TestClient

from fleetctl.controller.api.app import create_app
from fleetctl.controller.paths import bootstrap_token_path
from fleetctl.controller.settings import ControllerSettings

ROLES = ("viewer", "operator", "admin", "agent")
WHO_MAY = {
    "viewer": {"viewer", "operator", "admin"},
    "operator": {"operator", "admin"},
    "admin": {"admin"},
    "agent": {"agent", "admin"},
}


def routes(role: str) -> list[tuple[str, str, Any, str]]:
    """(method, path, body, role needed); bodies are unique per caller role so allowed calls succeed."""
    return [
        ("GET", "/api/v1/status", None, "viewer"),
        ("GET", "/api/v1/routing", None, "viewer"),
        ("GET", "/api/v1/nodes", None, "viewer"),
        ("GET", "/api/v1/nodes/n1", None, "viewer"),
        ("GET", "/api/v1/engines", None, "viewer"),
        ("GET", "/api/v1/classes", None, "viewer"),
        ("GET", "/api/v1/classes/chat/history", None, "viewer"),
        ("GET", "/api/v1/deployments", None, "viewer"),
        ("GET", "/api/v1/traffic", None, "viewer"),
        ("GET", "/api/v1/flags", None, "viewer"),
        ("GET", "/api/v1/audit", None, "viewer"),
        ("POST", "/api/v1/classes", {"name": f"c-{role}", "spec": SPEC}, "operator"),
        ("PUT", f"/api/v1/deployments/d-{role}", {"class_ref": "chat@r1", "replicas": 0}, "operator"),
        ("PUT", "/api/v1/traffic/smollm2-135m", {"weights": {"chat@r1": 1}}, "operator"),
        ("PUT", f"/api/v1/flags/shed_fraction:m-{role}", {"value": 0.1, "reason": "test"}, "operator"),
        ("POST", "/api/v1/nodes/n1/cordon", None, "operator"),
        ("POST", "/api/v1/nodes/n1/uncordon", None, "operator"),
        ("GET", "/api/v1/tokens", None, "admin"),
        ("POST", "/api/v1/tokens", {"name": f"t-{role}", "role": "viewer"}, "admin"),
        ("POST", "/api/v1/agents/register",
         {"node": f"a-{role}", "url": "http://x", "capacity": {"engines": 1, "kv_mib": 1}}, "agent"),
        ("POST", "/api/v1/agents/heartbeat", {"node": "n1", "generation": 0}, "agent"),
    ]


def serve_ready(api: Api, class_ref: str, node: str) -> None:
    deploy(api, "serving", class_ref, 1)
    api.reconcile()
    reply = beat(api, node)
    beat(api, node, reply["generation"], [observed(a, "ready") for a in reply["assignment"]])


@pytest.mark.parametrize("role", ROLES)
def test_each_role_is_allowed_and_refused_where_it_should_be(api: Api, role: str) -> None:
    apply_class(api)
    register(api, "n1")
    serve_ready(api, "chat@r1", "n1")  # traffic may only go to revisions with a ready engine
    for method, path, body, need in routes(role):
        response = api.call(method, path, role=role, json=body)
        if role in WHO_MAY[need]:
            assert response.status_code < 400, (method, path, role, response.text)
        else:
            assert response.status_code == 403, (method, path, role, response.text)
            error = response.json()["error"]
            assert error["code"] == "forbidden"
            assert f"needs role {need}" in error["message"]


@pytest.mark.parametrize(("header", "says"), [
    (None, "missing"),
    ("Bearer fleet_not-a-real-token", "unknown"),
    ("Basic dXNlcjpwYXNz", "missing"),
])
def test_missing_or_unknown_tokens_are_401(api: Api, header: str | None, says: str) -> None:
    headers = {"Authorization": header} if header else {}
    for method, path in (("GET", "/api/v1/status"), ("POST", "/api/v1/agents/heartbeat"), ("POST", "/api/v1/classes")):
        response = api.call(method, path, role=None, headers=headers, json={})
        assert response.status_code == 401
        assert says in response.json()["error"]["message"]
        assert "fleet_not-a-real-token" not in response.text


def test_revoked_token_is_refused_at_once(api: Api) -> None:
    created = api.call("POST", "/api/v1/tokens", json={"name": "ci", "role": "viewer"}).json()
    assert created["role"] == "viewer" and created["token"].startswith("fleet_")
    ok = api.http.get("/api/v1/status", headers={"Authorization": f"Bearer {created['token']}"})
    assert ok.status_code == 200
    assert api.call("DELETE", "/api/v1/tokens/ci").json()["result"] == "revoked"
    refused = api.http.get("/api/v1/status", headers={"Authorization": f"Bearer {created['token']}"})
    assert refused.status_code == 401
    listed = {t["name"]: t for t in api.call("GET", "/api/v1/tokens").json()}
    assert listed["ci"]["revoked_at"] is not None
    assert all("token" not in t and "token_sha256" not in t for t in listed.values())


def test_token_names_are_unique(api: Api) -> None:
    assert api.call("POST", "/api/v1/tokens", json={"name": "ci", "role": "viewer"}).status_code == 201
    again = api.call("POST", "/api/v1/tokens", json={"name": "ci", "role": "admin"})
    assert again.status_code == 409 and again.json()["error"]["field"] == "name"
    bad_role = api.call("POST", "/api/v1/tokens", json={"name": "ci2", "role": "root"})
    assert bad_role.status_code == 422 and bad_role.json()["error"]["field"] == "role"


def test_only_hashes_are_stored(api: Api) -> None:
    from sqlalchemy import select

    from fleetctl.controller.models import ApiToken

    with api.runtime.store.session() as session:
        stored = list(session.execute(select(ApiToken.token_sha256)).scalars())
    assert stored and all(len(h) == 64 for h in stored)
    assert not set(api.tokens.values()) & set(stored)


def test_bootstrap_token_is_written_once_with_mode_0600(settings: ControllerSettings) -> None:
    path = bootstrap_token_path(settings.state_dir)
    with TestClient(create_app(settings)) as http:
        token = path.read_text().strip()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert http.get("/api/v1/tokens", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    with TestClient(create_app(settings)):
        assert path.read_text().strip() == token  # second start: same token, file untouched


def test_env_bootstrap_token_is_admin(settings: ControllerSettings, tmp_path: Path) -> None:
    env_token = "an-env-token-of-enough-length"
    with TestClient(create_app(settings.model_copy(update={"bootstrap_token": env_token}))) as http:
        headers = {"Authorization": f"Bearer {env_token}"}
        created = http.post("/api/v1/tokens", json={"name": "from-env", "role": "viewer"}, headers=headers)
        assert created.status_code == 201
        assert created.json()["created_by"] == "bootstrap-env"


def test_the_last_active_admin_token_cannot_be_revoked_without_force(api: Api) -> None:
    admins = [t["name"] for t in api.call("GET", "/api/v1/tokens").json() if t["role"] == "admin" and not t["revoked_at"]]
    me = next(name for name in admins if name.startswith("test-admin"))
    for other in (name for name in admins if name != me):
        assert api.call("DELETE", f"/api/v1/tokens/{other}").status_code == 200
    refused = api.call("DELETE", f"/api/v1/tokens/{me}")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "last_admin"
    assert "--force" in refused.json()["error"]["message"]
    assert api.call("GET", "/api/v1/tokens").status_code == 200  # still an admin
    forced = api.call("DELETE", f"/api/v1/tokens/{me}", params={"force": "true"})
    assert forced.status_code == 200 and set(forced.json()["overridden"]) == {"last_admin", "own_token"}
    events = [e for e in api.call("GET", "/api/v1/audit", role="viewer").json() if e["action"] == "token.revoke"]
    assert any(e["code"] == "forced" for e in events) and any(e["code"] == "last_admin" for e in events)


def test_a_token_cannot_revoke_itself_without_force(api: Api) -> None:
    me = next(t["name"] for t in api.call("GET", "/api/v1/tokens").json() if t["name"].startswith("test-admin"))
    refused = api.call("DELETE", f"/api/v1/tokens/{me}")  # other admins exist (bootstrap): only own_token applies
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "own_token"
