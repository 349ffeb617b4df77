"""Gateways' per-revision counters reach the store: a report's `served` is kept per gateway (the latest
replaces the last), read back as the rollout machine's types by served_by_gateway (stale gateways kept,
old gateways without counters left out), and out-of-bounds counters are a 422 naming the field with
nothing stored (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from typing import Any

from ctl_helpers import Api

from fleetctl.controller.gateways import served_by_gateway
from fleetctl.controller.rollout.state import Histogram, ServedCounters
from fleetctl.controller.rollout.window import window_delta

BOUNDS = [0.01, 0.1, 1.0]
REPORT = {"name": "gw-a", "url": "http://10.0.0.5:8000", "generation": 7, "table_age_s": 0.4, "refresh_interval_s": 2.0}


def counters(requests: int, errors: int = 0, ttft_counts: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    ttft_counts = ttft_counts or [0, 0, 0]
    ttft = {"bounds": BOUNDS, "counts": ttft_counts, "count": ttft_counts[-1], "sum": 0.25}
    return {"requests": requests, "errors": errors, "rejections": 0, "ttft": ttft,
            "itl": {"bounds": [], "counts": [], "count": 0, "sum": 0.0}, **extra}


OVERFLOW = "__1e400__"  # JSON's 1e400 parses as infinity; Python's JSON writer cannot write one


def report(api: Api, **body: Any) -> Any:
    text = json.dumps({**REPORT, **body}).replace(f'"{OVERFLOW}"', "1e400")
    return api.call("POST", "/api/v1/gateways/report", role="viewer", content=text,
                    headers={"content-type": "application/json"})


def stored(api: Api, refs: list[str] | None = None) -> Any:
    with api.runtime.store.session() as session:
        return served_by_gateway(session, refs, now=api.clock.now)


def test_reported_counters_are_stored_per_gateway_and_read_back(api: Api) -> None:
    assert report(api, served={"m@r1": counters(10, 1, [2, 5, 6]), "m@r2": counters(3)}).status_code == 200
    assert report(api, name="gw-b", served={"m@r2": counters(4, 2)}).status_code == 200
    assert report(api, name="gw-old").status_code == 200  # an older gateway: no counters, still acknowledged
    served = stored(api)
    assert sorted(served) == ["gw-a", "gw-b"]
    assert served["gw-a"]["m@r1"] == ServedCounters(10, 1, 0, Histogram(tuple(BOUNDS), (2, 5, 6), 6, 0.25), Histogram())
    assert stored(api, ["m@r2"]) == {"gw-a": {"m@r2": served["gw-a"]["m@r2"]}, "gw-b": {"m@r2": served["gw-b"]["m@r2"]}}


def test_the_latest_report_replaces_the_last_and_windows_are_measured_between_readings(api: Api) -> None:
    report(api, served={"m@r1": counters(10, 1, [2, 5, 6])})
    start = stored(api)
    api.clock.advance(2)
    report(api, served={"m@r1": counters(25, 2, [6, 12, 14])})
    delta = window_delta(start, stored(api))["m@r1"]
    assert (delta.requests, delta.errors, delta.ttft.counts, delta.ttft.count) == (15, 1, (4, 7, 8), 8)


def test_a_stale_gateway_keeps_its_last_counters(api: Api) -> None:
    report(api, served={"m@r1": counters(10)})
    api.clock.advance(60)  # far past 3 refresh intervals: listed as stale
    assert api.call("GET", "/api/v1/gateways", role="viewer").json()[0]["stale"] is True
    assert stored(api)["gw-a"]["m@r1"].requests == 10


def test_out_of_bounds_counters_are_422_naming_the_field_and_nothing_is_stored(api: Api) -> None:
    too_many_buckets = {"bounds": [float(i) for i in range(65)], "counts": [0] * 65, "count": 0, "sum": 0.0}
    cases = [
        ({"m@r1": counters(-1)}, "served.m@r1.requests"),
        ({"m@r1": counters(2**63)}, "served.m@r1.requests"),
        ({"m@r1": counters(1, errors=2)}, "served.m@r1.errors"),
        ({"m@r1": counters(5, ttft={"bounds": BOUNDS, "counts": [1, 2], "count": 2, "sum": 0.0})}, "served.m@r1.ttft.counts"),
        ({"m@r1": counters(5, ttft={"bounds": BOUNDS, "counts": [3, 2, 4], "count": 4, "sum": 0.0})}, "served.m@r1.ttft.counts"),
        ({"m@r1": counters(5, ttft={"bounds": [1.0, 0.1, 2.0], "counts": [0, 0, 0], "count": 0, "sum": 0.0})},
         "served.m@r1.ttft.bounds"),
        ({"m@r1": counters(5, ttft={"bounds": BOUNDS, "counts": [1, 2, 4], "count": 3, "sum": 0.0})}, "served.m@r1.ttft.count"),
        ({"m@r1": counters(5, itl=too_many_buckets)}, "served.m@r1.itl.bounds"),
        ({"m@r1": counters(5, ttft={"bounds": BOUNDS, "counts": [0, 0, 0], "count": 0, "sum": OVERFLOW})}, "served.m@r1.ttft.sum"),
        ({f"m@r{i}": counters(1) for i in range(257)}, "served"),
    ]
    for served, field in cases:
        response = report(api, served=served)
        assert (response.status_code, response.json()["error"]["field"]) == (422, field), response.text
    assert api.call("GET", "/api/v1/gateways", role="viewer").json() == []
    assert stored(api) == {}
