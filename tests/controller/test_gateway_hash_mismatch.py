"""A gateway's report names the engines whose KV events hash prefixes with another seed; the controller keeps
the latest per gateway and `status` marks those engines while the gateway is live (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api
from rollout_helpers import served_by_r1

REPORT = {"name": "gw-a", "url": "http://10.0.0.5:8000", "generation": 1, "table_age_s": 0.1, "refresh_interval_s": 2.0}


def report(api: Api, **body: Any) -> Any:
    return api.call("POST", "/api/v1/gateways/report", role="viewer", json={**REPORT, **body})


def marked(api: Api) -> dict[str, bool]:
    engines = api.call("GET", "/api/v1/status", role="viewer").json()["engines"]
    return {e["name"]: e["hash_mismatch"] for e in engines}


def test_an_engine_a_live_gateway_flags_is_marked_in_status_until_the_gateway_says_otherwise(api: Api) -> None:
    served_by_r1(api)
    (engine,) = marked(api)
    assert marked(api) == {engine: False}
    assert report(api, hash_mismatch=[engine]).status_code == 200
    assert marked(api) == {engine: True}
    assert api.call("GET", "/api/v1/gateways", role="viewer").json()[0]["hash_mismatch"] == [engine]
    assert report(api, hash_mismatch=[]).status_code == 200  # the latest report replaces the last
    assert marked(api) == {engine: False}


def test_a_stale_gateways_flag_no_longer_marks_the_engine(api: Api) -> None:
    served_by_r1(api)
    (engine,) = marked(api)
    report(api, hash_mismatch=[engine])
    api.clock.advance(60)  # far past 3 refresh intervals: the gateway is stale
    assert marked(api) == {engine: False}


def test_a_gateway_that_does_not_check_flags_nothing(api: Api) -> None:
    served_by_r1(api)
    assert report(api).status_code == 200
    assert set(marked(api).values()) == {False}
    assert api.call("GET", "/api/v1/gateways", role="viewer").json()[0]["hash_mismatch"] == []


def test_too_many_flagged_engines_is_422_naming_the_field(api: Api) -> None:
    response = report(api, hash_mismatch=[f"e{i}" for i in range(5000)])
    assert response.status_code == 422 and response.json()["error"]["field"] == "hash_mismatch"
    assert api.call("GET", "/api/v1/gateways", role="viewer").json() == []
