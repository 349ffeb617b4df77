"""Resource versions (controller/versions.py): every changeable object serves its version as the ETag, and
`If-Match` makes a change conditional on it, on SQLite and PostgreSQL."""

from __future__ import annotations

from ctl_helpers import Api, apply_class, deploy


def test_a_deployment_serves_its_version_and_honours_if_match(api: Api) -> None:
    ref = apply_class(api)["ref"]
    created = deploy(api, "chat", ref, 1)
    assert created["version"] == 1
    shown = api.call("GET", "/api/v1/deployments/chat", role="viewer")
    assert shown.headers["ETag"] == '"1"'
    body = {"class_ref": ref, "replicas": 2}
    updated = api.call("PUT", "/api/v1/deployments/chat", role="operator", json=body, headers={"If-Match": '"1"'})
    assert updated.status_code == 200 and updated.json()["version"] == 2 and updated.headers["ETag"] == '"2"'

    stale = api.call("PUT", "/api/v1/deployments/chat", role="operator", json={**body, "replicas": 3},
                     headers={"If-Match": '"1"'})
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "version_conflict"
    assert "version 2" in stale.json()["error"]["message"]
    assert api.call("GET", "/api/v1/deployments/chat", role="viewer").json()["replicas"] == 2  # nothing written

    refused = api.call("DELETE", "/api/v1/deployments/chat", role="operator", headers={"If-Match": "1"})
    assert refused.status_code == 409
    assert api.call("DELETE", "/api/v1/deployments/chat", role="operator", headers={"If-Match": "2"}).status_code == 200


def test_if_match_on_a_missing_object_is_a_404_and_a_bad_one_a_422(api: Api) -> None:
    ref = apply_class(api)["ref"]
    missing = api.call("PUT", "/api/v1/deployments/ghost", role="operator", json={"class_ref": ref, "replicas": 1},
                       headers={"If-Match": '"1"'})
    assert missing.status_code == 404
    bad = api.call("PUT", "/api/v1/flags/pd_push", role="operator", json={"value": True, "reason": "t"},
                   headers={"If-Match": "latest"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "If-Match"


def test_a_flag_advances_its_version_only_when_it_changes(api: Api) -> None:
    body = {"reason": "test"}
    first = api.call("PUT", "/api/v1/flags/pd_push", role="operator", json={"value": False, **body}).json()
    same = api.call("PUT", "/api/v1/flags/pd_push", role="operator", json={"value": False, **body}).json()
    changed = api.call("PUT", "/api/v1/flags/pd_push", role="operator", json={"value": True, **body},
                       headers={"If-Match": '"1"'})
    assert (first["version"], same["version"], changed.json()["version"]) == (1, 1, 2)
    assert api.call("GET", "/api/v1/flags", role="viewer").json()["pd_push"]["version"] == 2
