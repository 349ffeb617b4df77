"""Replica classes through the API: idempotent apply, revisions, history with diffs, reads."""

from __future__ import annotations

from ctl_helpers import SPEC, Api, apply_class

from fleetctl.replica_class import ReplicaClassSpec


def test_apply_creates_r1_then_identical_content_is_a_noop(api: Api) -> None:
    first = api.call("POST", "/api/v1/classes", role="operator", json={"name": "chat", "spec": SPEC})
    assert first.status_code == 201
    assert first.json()["ref"] == "chat@r1" and first.json()["result"] == "created"
    assert first.json()["digest"] == ReplicaClassSpec(**SPEC).digest()
    # the same content, spelled with defaults, is the same revision
    again = api.call("POST", "/api/v1/classes", role="operator",
                     json={"name": "chat", "spec": {**SPEC, "dtype": "float32", "block_size": 16}})
    assert again.status_code == 200
    assert again.json()["ref"] == "chat@r1" and again.json()["result"] == "unchanged"
    assert [c["ref"] for c in api.call("GET", "/api/v1/classes/chat/history", role="viewer").json()] == ["chat@r1"]


def test_changed_content_creates_the_next_revision(api: Api) -> None:
    apply_class(api)
    second = apply_class(api, dtype="bfloat16", max_num_seqs=128)
    assert second["ref"] == "chat@r2" and second["revision"] == 2
    # re-applying r1's content returns r1 (content-addressed), not a new r3
    assert apply_class(api)["ref"] == "chat@r1"
    assert api.call("GET", "/api/v1/classes/chat", role="viewer").json()["ref"] == "chat@r2"
    assert api.call("GET", "/api/v1/classes/chat@r1", role="viewer").json()["spec"]["dtype"] == "float32"


def test_history_diffs_consecutive_revisions_correctness_first(api: Api) -> None:
    apply_class(api)
    apply_class(api, dtype="bfloat16", max_num_seqs=128)
    apply_class(api, dtype="bfloat16", max_num_seqs=128, kv_cache_mib=512)
    history = api.call("GET", "/api/v1/classes/chat/history", role="viewer").json()
    assert [h["ref"] for h in history] == ["chat@r1", "chat@r2", "chat@r3"]
    assert history[0]["changes"] == []
    assert history[1]["changes"] == [
        {"field": "dtype", "tag": "correctness", "old": "float32", "new": "bfloat16"},
        {"field": "max_num_seqs", "tag": "performance", "old": 64, "new": 128},
    ]
    assert history[2]["changes"] == [{"field": "kv_cache_mib", "tag": "performance", "old": 256, "new": 512}]


def test_list_and_missing(api: Api) -> None:
    apply_class(api, "chat")
    apply_class(api, "chat", max_num_seqs=8)
    apply_class(api, "code")
    listed = {c["name"]: c for c in api.call("GET", "/api/v1/classes", role="viewer").json()}
    assert listed["chat"]["latest"] == "chat@r2" and listed["chat"]["revisions"] == 2
    assert listed["code"]["latest"] == "code@r1"
    for path in ("/api/v1/classes/nope", "/api/v1/classes/chat@r9", "/api/v1/classes/nope/history"):
        response = api.call("GET", path, role="viewer")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
