"""The canary API: status with evidence (not measured shown as such), a class revision's streams and probe
history (by NAME@rN or NAME), events; bad input is a 4xx naming the field; reads need a token."""

from __future__ import annotations

from canary_store_helpers import MODEL, add_probes, store_reference
from ctl_helpers import Api, apply_class, deploy

R1 = "chat@r1"


def measured(api: Api) -> None:
    apply_class(api)
    deploy(api, "chat", R1, 1)
    ref = store_reference(api, R1)
    add_probes(api, ref, R1, 10)
    add_probes(api, ref, R1, 6, diverged=True)
    add_probes(api, ref, R1, 4, condition=4)
    add_probes(api, ref, R1, 2, failed=True)
    api.reconcile()


def test_status_shows_each_stream_with_its_evidence(api: Api) -> None:
    measured(api)
    body = api.call("GET", "/api/v1/canary/status", role="viewer", params={"model": MODEL}).json()
    assert [(s["class_ref"], s["batch"], s["verdict"]) for s in body] == [(R1, "b1", "drifting"),
                                                                          (R1, "b4", "not_measured")]
    evidence = body[0]["evidence"]
    assert (evidence["probes"], evidence["bad"], evidence["first_divergence"]) == (16, 6, 2)  # the failed probes are not scored
    assert evidence["statistic"] >= evidence["threshold"] == 5.0
    assert sum(evidence["bad_prompts"].values()) == 6 and len(evidence["trend"]) == 16
    assert api.call("GET", "/api/v1/canary/status", role="viewer", params={"model": "other"}).json() == []


def test_a_class_shows_its_streams_and_probe_history(api: Api) -> None:
    measured(api)
    body = api.call("GET", "/api/v1/canary/classes/chat", role="viewer", params={"limit": 3}).json()
    assert body["class_ref"] == R1 and [s["batch"] for s in body["streams"]] == ["b1", "b4"]
    assert [p["id"] for p in body["probes"]] == [20, 21, 22]  # the latest, oldest first
    assert body["probes"][-1]["score"] is None and body["probes"][-1]["error"] == "timeout"


def test_events_list_the_verdict_changes(api: Api) -> None:
    measured(api)
    body = api.call("GET", "/api/v1/canary/events", role="viewer", params={"model": MODEL}).json()
    assert [(e["batch"], e["verdict_from"], e["verdict_to"]) for e in body] == [("b1", "not_measured", "healthy"),
                                                                                 ("b1", "healthy", "drifting")]
    assert body[-1]["evidence"]["bad"] == 6 and "healthy -> drifting" in body[-1]["message"]
    last = api.call("GET", "/api/v1/canary/events", role="viewer", params={"limit": 1}).json()
    assert [e["id"] for e in last] == [body[-1]["id"]]


def test_bad_input_names_the_field_and_reads_need_a_token(api: Api) -> None:
    unknown = api.call("GET", "/api/v1/canary/classes/nope@r9", role="viewer")
    assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "class"
    for params in ({"limit": 0}, {"limit": 100_000}):
        bad = api.call("GET", "/api/v1/canary/events", role="viewer", params=params)
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "limit", bad.text
    assert api.call("GET", "/api/v1/canary/status", role=None).status_code == 401
