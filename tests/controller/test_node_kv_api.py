"""The nodes' KV tiers at the controller, on SQLite and PostgreSQL: each beat's tier reports are stored and
served with the node; a flush is audited, travels in the heartbeat reply until the agent reports it done,
and is then cleared; the kv_tier_disk flag travels in every reply; bad input is refused naming the field and
changes nothing."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api, beat, register

DRAM = {"class_name": "chat", "tier": "dram", "medium": "CPU", "enabled": True, "capacity_bytes": 128 << 20,
        "used_bytes": 3 << 20, "blocks": 4, "hits": 3, "misses": 1, "fetch_seconds_sum": 0.004, "fetches": 2,
        "corrupt": 0, "offloaded": 9, "refused": 0}
DISK = {**DRAM, "tier": "disk", "medium": "STORAGE", "capacity_bytes": 1 << 30, "used_bytes": 5 << 20, "blocks": 6,
        "hits": 1, "misses": 3, "corrupt": 1}


def tier_beat(api: Api, node: str, kv_tiers: list[dict[str, Any]], kv_flushed: dict[str, Any] | None = None,
              generation: int = 0) -> Any:
    body = {"node": node, "generation": generation, "engines": [], "kv_tiers": kv_tiers, "kv_flushed": kv_flushed}
    return api.call("POST", "/api/v1/agents/heartbeat", role="agent", json=body)


def node(api: Api, name: str) -> dict[str, Any]:
    response = api.call("GET", f"/api/v1/nodes/{name}", role="viewer")
    assert response.status_code == 200, response.text
    return response.json()


def flush(api: Api, name: str, role: str = "operator", **body: Any) -> Any:
    return api.call("POST", f"/api/v1/nodes/{name}/kv/flush", role=role, json=body,
                    headers={"X-Fleet-Reason": "stale blocks after a weights fix"})


def test_each_beat_replaces_the_nodes_tier_reports(api: Api) -> None:
    register(api, "n1")
    assert node(api, "n1")["kv_tiers"] == []
    for reports in ([DRAM, DISK], [DRAM], []):
        assert tier_beat(api, "n1", reports).status_code == 200
        api.runtime.heartbeats.flush()
        shown = node(api, "n1")["kv_tiers"]
        assert [(t["class_name"], t["tier"], t["blocks"], t["hits"]) for t in shown] == [
            (t["class_name"], t["tier"], t["blocks"], t["hits"]) for t in reports]


def test_a_bad_tier_report_is_refused_naming_the_field_and_changes_nothing(api: Api) -> None:
    register(api, "n1")
    assert tier_beat(api, "n1", [DRAM]).status_code == 200
    api.runtime.heartbeats.flush()
    for bad, field in (({**DRAM, "tier": "ssd"}, "tier"), ({**DRAM, "blocks": -1}, "blocks"),
                       ({**DRAM, "class_name": ""}, "class_name"), ({**DRAM, "fetch_seconds_sum": "nan"}, "fetch_seconds_sum")):
        response = tier_beat(api, "n1", [bad])
        assert response.status_code == 422, response.text
        assert field in response.json()["error"]["field"]
    api.runtime.heartbeats.flush()
    assert [t["blocks"] for t in node(api, "n1")["kv_tiers"]] == [DRAM["blocks"]]


def test_a_flush_travels_in_the_reply_until_the_agent_reports_it_done(api: Api) -> None:
    register(api, "n1")
    first = beat(api, "n1")
    assert first["kv"] == {"disk": True, "flush": None}
    accepted = flush(api, "n1", class_name="chat", tier="disk")
    assert accepted.status_code == 200, accepted.text
    asked = accepted.json()["flush"]
    assert (asked["id"], asked["class_name"], asked["tier"]) == (1, "chat", "disk") and asked["by"]
    reply = beat(api, "n1", first["generation"])
    assert reply["kv"]["flush"] == {"id": 1, "class_name": "chat", "tier": "disk"}
    assert reply["generation"] == first["generation"] + 1
    assert reply == beat(api, "n1", reply["generation"])  # asked again until done (the agent runs it once)
    done = tier_beat(api, "n1", [DRAM], kv_flushed={"id": 1, "dropped": {"chat": 6}}, generation=reply["generation"])
    assert done.status_code == 200
    api.runtime.heartbeats.flush()
    shown = node(api, "n1")
    assert shown["kv_flush"] is None
    assert (shown["kv_flushed"]["id"], shown["kv_flushed"]["dropped"]) == (1, {"chat": 6})
    after = tier_beat(api, "n1", [DRAM], kv_flushed={"id": 1, "dropped": {"chat": 6}}, generation=reply["generation"])
    assert after.json()["kv"]["flush"] is None
    audit = [e for e in api.call("GET", "/api/v1/audit", role="viewer").json() if e["action"] == "node.kv_flush"]
    assert [(e["target"], e["reason"]) for e in audit] == [("n1", "stale blocks after a weights fix")]


def test_a_second_flush_replaces_one_not_yet_done_and_a_stale_done_report_clears_nothing(api: Api) -> None:
    register(api, "n1")
    beat(api, "n1")
    flush(api, "n1")
    second = flush(api, "n1", tier="dram").json()["flush"]
    assert second["id"] == 2
    tier_beat(api, "n1", [], kv_flushed={"id": 1, "dropped": {}})  # the agent ran the first before the second
    api.runtime.heartbeats.flush()
    pending = node(api, "n1")["kv_flush"]
    assert (pending["id"], pending["tier"], pending["class_name"]) == (2, "dram", None)


def test_the_disk_flag_travels_in_every_reply(api: Api) -> None:
    register(api, "n1")
    assert beat(api, "n1")["kv"]["disk"] is True
    response = api.call("PUT", "/api/v1/flags/kv_tier_disk", role="operator", json={"value": False},
                        headers={"X-Fleet-Reason": "disk errors on the node pool"})
    assert response.status_code == 200, response.text
    api.runtime.heartbeats.flush()
    assert beat(api, "n1")["kv"]["disk"] is False
    api.call("DELETE", "/api/v1/flags/kv_tier_disk", role="operator")
    api.runtime.heartbeats.flush()
    assert beat(api, "n1")["kv"]["disk"] is True


def test_bad_flushes_are_refused_naming_the_field_and_store_nothing(api: Api) -> None:
    register(api, "n1")
    beat(api, "n1")
    cases = [("n1", {"tier": "ssd"}, "operator", 422, "tier"), ("n1", {"class_name": "Not A Class"}, "operator", 422,
             "class_name"), ("n1", {"layers": 3}, "operator", 422, "layers"), ("ghost", {}, "operator", 404, "node"),
             ("n1", {}, "viewer", 403, None)]
    for name, body, role, status, field in cases:
        response = flush(api, name, role=role, **body)
        assert response.status_code == status, (body, response.text)
        if field is not None:
            assert field in (response.json()["error"]["field"] or ""), response.text
    assert node(api, "n1")["kv_flush"] is None
