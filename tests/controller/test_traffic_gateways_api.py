"""Gateways acknowledge the routing generation they applied (report, list, stale), and the routing
generation is a counter: one generation never names two different tables, even under concurrent writers
and readers (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading

from sqlalchemy.orm.exc import StaleDataError
from typing import Any

from ctl_helpers import Api, apply_class, beat, deploy, observed, register
from sqlalchemy import delete

from fleetctl.client import AsyncControllerClient
from fleetctl.controller import routing_generation, views
from fleetctl.controller.models import FeatureFlag, RoutingState
from fleetctl.controller.server import free_port
from fleetctl.gateway.table_reporter import report_applied

REPORT = {"name": "gw-a", "url": "http://10.0.0.5:8000", "generation": 7, "table_age_s": 0.4, "refresh_interval_s": 2.0}


def report(api: Api, role: str = "viewer", **body: Any) -> Any:
    return api.call("POST", "/api/v1/gateways/report", role=role, json={**REPORT, **body})


def routing(api: Api) -> dict[str, Any]:
    return api.call("GET", "/api/v1/routing", role="viewer").json()


def gateways(api: Api) -> list[dict[str, Any]]:
    response = api.call("GET", "/api/v1/gateways", role="viewer")
    assert response.status_code == 200, response.text
    return response.json()


def test_gateways_report_and_are_listed_with_last_seen(api: Api) -> None:
    assert gateways(api) == []
    first = report(api)
    assert first.status_code == 200, first.text
    api.clock.advance(1)
    report(api, generation=9, table_age_s=0.1)
    report(api, name="gw-b", url=None, generation=8, refresh_interval_s=None)
    (a, b) = gateways(api)
    assert (a["name"], a["url"], a["generation"], a["table_age_s"], a["stale"]) == ("gw-a", REPORT["url"], 9, 0.1, False)
    assert a["first_seen"] == "2026-01-01T00:00:00+00:00" and a["last_seen"] == "2026-01-01T00:00:01+00:00"
    assert a["reported_by"].startswith("test-viewer-")
    assert (b["name"], b["url"], b["refresh_interval_s"]) == ("gw-b", None, 2.0)  # the gateway's default


def test_a_gateway_is_stale_after_three_refresh_intervals(api: Api) -> None:
    report(api, refresh_interval_s=2.0)
    report(api, name="gw-slow", refresh_interval_s=10.0)
    api.clock.advance(6)
    assert [(g["name"], g["stale"]) for g in gateways(api)] == [("gw-a", False), ("gw-slow", False)]
    api.clock.advance(0.5)
    assert [(g["name"], g["stale"], g["seen_ago_s"]) for g in gateways(api)] == [("gw-a", True, 6.5), ("gw-slow", False, 6.5)]
    report(api)
    assert gateways(api)[0]["stale"] is False


def test_reports_are_viewer_calls_and_not_audited(api: Api) -> None:
    for role in ("viewer", "operator", "admin"):
        assert report(api, role=role).status_code == 200
    forbidden = report(api, role="agent")
    assert (forbidden.status_code, forbidden.json()["error"]["code"]) == (403, "forbidden")
    assert api.call("POST", "/api/v1/gateways/report", role=None, json=REPORT).status_code == 401
    assert api.call("GET", "/api/v1/gateways", role="agent").status_code == 403
    events = api.call("GET", "/api/v1/audit", role="viewer").json()
    assert [e["action"] for e in events] == []


def test_bad_reports_are_422_naming_the_field(api: Api) -> None:
    for body, field in [({"name": "GW A"}, "name"), ({"generation": -1}, "generation"), ({"table_age_s": -2}, "table_age_s"),
                        ({"refresh_interval_s": 0}, "refresh_interval_s")]:
        response = report(api, **body)
        assert (response.status_code, response.json()["error"]["field"]) == (422, field), response.text
    assert gateways(api) == []


def test_equal_tables_keep_their_generation_and_changes_advance_it(api: Api) -> None:
    first = api.call("GET", "/api/v1/routing", role="viewer").json()["generation"]
    assert api.call("GET", "/api/v1/routing", role="viewer").json()["generation"] == first
    api.call("PUT", "/api/v1/flags/prefix_routing", role="operator", json={"value": False, "reason": "test"})
    second = api.call("GET", "/api/v1/routing", role="viewer").json()["generation"]
    assert second == first + 1


def test_a_generation_names_exactly_the_changes_stamped_up_to_it_under_concurrency(api: Api) -> None:
    """Two writers change a flag and stamp in the same transaction (as PUT /traffic does); two readers
    stamp as GET /routing does. The table a generation names must hold exactly the last value written
    at or below it: a gateway at generation >= G has every change stamped G, and nothing is named twice."""
    store, writes, reads, errors = api.runtime.store, [], [], []
    lock = threading.Lock()

    def stamp(value: int | None) -> None:
        for _attempt in range(50):  # a concurrent writer of the flag's version wins: re-read and retry, as a client would
            try:
                with store.session() as session:
                    if value is not None:
                        session.get(FeatureFlag, "f").value = value
                    generation, content = routing_generation.stamp(session, lambda: views.routing_content(session))
                break
            except StaleDataError:
                continue
        with lock:
            (writes if value is not None else reads).append((generation, content["flags"]["f"]))

    def run(worker: int) -> None:
        try:
            for i in range(25):
                stamp(worker * 100 + i if worker < 2 else None)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with store.session() as session:
        session.add(FeatureFlag(name="f", value=-1, updated_at=api.clock.now, updated_by="test"))
    writes.append((routing(api)["generation"], -1))
    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    written = sorted(writes)
    assert len({g for g, _ in written}) == len(written)  # every write advanced the generation
    for generation, value in reads + writes:
        expected = [v for g, v in written if g <= generation][-1]
        assert value == expected, (generation, value, written)
    final = routing(api)
    assert (final["generation"], final["flags"]["f"]) == written[-1]


def test_engine_metrics_alone_do_not_advance_the_generation(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    assignment = beat(api, "n1")["assignment"][0]
    beat(api, "n1", 1, [observed(assignment, "ready")])
    before = routing(api)
    busier = observed(assignment, "ready")
    busier["metrics"]["num_requests_running"] = 9
    api.clock.advance(5)  # stored metrics are refreshed every 5 s (controller/heartbeats.py), states at once
    beat(api, "n1", 1, [busier])
    after = routing(api)
    assert after["engines"][0]["metrics"]["num_requests_running"] == 9 and after["generation"] == before["generation"]
    beat(api, "n1", 1, [observed(assignment, "draining")])
    assert routing(api)["generation"] == before["generation"] + 1


def test_the_counter_row_is_recreated_if_missing(api: Api) -> None:
    with api.runtime.store.session() as session:
        session.execute(delete(RoutingState))
    assert routing(api)["generation"] == 1
    assert routing(api)["generation"] == 1


async def test_a_failed_report_is_logged_not_raised() -> None:
    """The gateway's reporter never lets controller trouble reach the data plane."""
    async with AsyncControllerClient(f"http://127.0.0.1:{free_port()}", "t", timeout=2) as client:
        assert await report_applied(client, "gw-a", None, 3, 0.5) is False
