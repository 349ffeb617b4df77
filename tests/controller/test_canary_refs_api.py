"""The canary's golden sets and references in the store, through the API, on SQLite and PostgreSQL: a golden
set is stored once per version (the same one again is unchanged, other content a 409 naming `version`), a bad
one is a 422 naming the entry; a reference is stored only when its class revision exists, its correctness
digest is that revision's, its golden set is stored for the same model and it answers exactly the set's
prompts; the lists are summaries; every POST is audited."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api, apply_class

from fleetctl.canary.golden import load_golden, shipped_golden
from fleetctl.canary.types import ConditionNoise, PromptReference, Reference
from fleetctl.controller.canary_refs import reference_for
from fleetctl.controller.models import CanaryReference, GoldenSetRow
from fleetctl.replica_class import ReplicaClassSpec, correctness_digest

TINY = {"model": "tiny", "weights": "tiny"}
GOLDEN = load_golden(shipped_golden("tiny"))


def golden_body(**changes: Any) -> dict[str, Any]:
    return {**GOLDEN.model_dump(mode="json"), **changes}


def post_golden(api: Api, body: dict[str, Any], role: str = "operator") -> Any:
    return api.call("POST", "/api/v1/canary/golden-sets", role=role, json={"golden_set": body, "reason": "test"})


def reference(class_ref: str, *, model: str = "tiny", digest: str | None = None, drop: str | None = None,
              extra: str | None = None, expected_fail: bool = False) -> dict[str, Any]:
    ids = [p.id for p in GOLDEN.prompts if p.id != drop] + ([extra] if extra else [])
    prompts = {pid: PromptReference(
        prompt_id=pid, tokens=[1, 2, 3], text="x", top_logprobs=[[(1, -0.1), (2, -2.5)]] * 3,
        expected_pass=(False if expected_fail and i == 0 else True if i < 2 else None),
        noise={1: ConditionNoise(runs=3, diverged=0), 4: ConditionNoise(runs=3, diverged=1 if i == 0 else 0,
                                                                         max_distance=0.25 if i == 0 else 0.0)})
        for i, pid in enumerate(ids)}
    spec = ReplicaClassSpec.model_validate(TINY)
    return Reference(golden_set="tiny", golden_version=1, model=model, class_ref=class_ref,
                     correctness_digest=digest or correctness_digest(spec), recorded_at="2026-01-01T00:00:00Z",
                     recorded_by="someone", prompts=prompts).model_dump(mode="json")


def post_reference(api: Api, body: dict[str, Any]) -> Any:
    return api.call("POST", "/api/v1/canary/references", role="operator", json={"reference": body})


def audited(api: Api, action: str) -> list[tuple[str, str, int]]:
    events = api.call("GET", "/api/v1/audit", role="viewer").json()
    return [(e["target"], e["result"], e["status"]) for e in events if e["action"] == action]


def stored(api: Api, table: type) -> int:
    with api.runtime.store.session() as session:
        return session.query(table).count()


def test_a_golden_set_is_stored_once_per_version(api: Api) -> None:
    first = post_golden(api, golden_body())
    assert first.status_code == 200, first.text
    summary = first.json()
    assert (summary["name"], summary["version"], summary["model"], summary["prompts"], summary["result"]) == \
        ("tiny", 1, "tiny", 12, "changed")
    assert post_golden(api, golden_body()).json()["result"] == "unchanged"
    clash = post_golden(api, golden_body(description="other content"))
    assert clash.status_code == 409 and clash.json()["error"]["field"] == "version", clash.text
    assert post_golden(api, golden_body(description="other content", version=2)).json()["result"] == "changed"
    listed = api.call("GET", "/api/v1/canary/golden-sets", role="viewer").json()
    assert [(g["name"], g["version"], g["prompts"]) for g in listed] == [("tiny", 1, 12), ("tiny", 2, 12)]
    assert listed[0]["digest"] == summary["digest"] != listed[1]["digest"]
    events = audited(api, "canary.golden_set.put")
    assert [(result, status) for _, result, status in events] == [("ok", 200), ("noop", 200), ("refused", 409), ("ok", 200)]
    assert [events[i][0] for i in (0, 1, 3)] == ["golden-sets/tiny/v1", "golden-sets/tiny/v1", "golden-sets/tiny/v2"]


def test_a_bad_golden_set_is_a_422_naming_the_entry_and_nothing_is_stored(api: Api) -> None:
    prompts = golden_body()["prompts"]
    bad = golden_body(prompts=[prompts[0], {**prompts[1], "prompt": "and a prompt"}])
    response = post_golden(api, bad)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "prompts.1.messages"
    assert error["message"] == "golden set tiny: prompts[1] (id 'chat-capital'): messages and prompt are exclusive"
    assert post_golden(api, golden_body(prompts=[])).json()["error"]["field"] == "prompts"
    assert post_golden(api, golden_body(version=2**31)).json()["error"]["field"] == "version"
    assert post_golden(api, golden_body(model="m" * 201)).json()["error"]["field"] == "model"
    assert post_golden(api, golden_body(), role="viewer").status_code == 403
    assert stored(api, GoldenSetRow) == 0


def test_a_reference_is_stored_and_listed_as_a_summary(api: Api) -> None:
    ref = apply_class(api, "tiny", **TINY)["ref"]
    post_golden(api, golden_body())
    response = post_reference(api, reference(ref, expected_fail=True))
    assert response.status_code == 201, response.text
    summary = response.json()
    assert (summary["model"], summary["class_ref"], summary["golden_set"], summary["golden_version"]) == \
        ("tiny", ref, "tiny", 1)
    assert summary["prompts"] == 12 and summary["recorded_by"] != "someone"  # the caller's token, not the body's
    assert summary["noise"] == {"1": {"runs": 36, "diverged": 0, "max_distance": 0.0},
                                "4": {"runs": 36, "diverged": 1, "max_distance": 0.25}}
    assert (summary["expected_passed"], summary["expected_failed"]) == (1, 1)
    assert "top_logprobs" not in response.text
    listed = api.call("GET", "/api/v1/canary/references", role="viewer", params={"model": "tiny"}).json()
    assert [r["id"] for r in listed] == [summary["id"]]
    assert api.call("GET", "/api/v1/canary/references", role="viewer", params={"model": "other"}).json() == []
    with api.runtime.store.session() as session:
        chosen = reference_for(session, "tiny", ref)
    assert chosen is not None and (chosen.id, chosen.mode, chosen.golden.name) == (summary["id"], "exact", "tiny")
    assert chosen.reference.prompts["chat-hello"].top_logprobs == [[(1, -0.1), (2, -2.5)]] * 3
    assert audited(api, "canary.reference.put") == [(f"references/{summary['id']}", "ok", 201)]


def test_a_reference_that_does_not_fit_the_store_is_refused_naming_the_field(api: Api) -> None:
    ref = apply_class(api, "tiny", **TINY)["ref"]
    other = apply_class(api, "chat")["ref"]  # serves smollm2-135m
    missing_golden = post_reference(api, reference(ref))
    assert (missing_golden.status_code, missing_golden.json()["error"]["field"]) == (422, "golden_set")
    post_golden(api, golden_body())
    refusals = {
        "class_ref": (reference("nope@r1"), 404),
        "model": (reference(other), 422),
        "correctness_digest": (reference(ref, digest="0" * 64), 422),
        "prompts.chat-long": (reference(ref, drop="chat-long"), 422),
        "prompts.surprise": (reference(ref, extra="surprise"), 422),
    }
    for field, (body, status) in refusals.items():
        response = post_reference(api, body)
        assert (response.status_code, response.json()["error"]["field"]) == (status, field), response.text
    assert "'chat-long' of golden set 'tiny' has no reference" in post_reference(api, reference(ref, drop="chat-long")).text
    assert stored(api, CanaryReference) == 0
    assert {result for _, result, _ in audited(api, "canary.reference.put")} == {"refused"}
