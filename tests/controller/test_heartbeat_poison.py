"""One bad beat cannot poison the write-behind buffer (fleetctl/controller/heartbeats.py), on SQLite and
PostgreSQL: a batch the store refuses is written beat by beat, the refused beat is dropped with an audit
event and a count by reason, the others are stored, and every other call keeps answering."""

from __future__ import annotations

from datetime import datetime

from ctl_helpers import Api, beat, register
from sqlalchemy import select

from engine.contract.prometheus import parse_samples, sum_series
from fleetctl.controller.contract import HeartbeatRequest
from fleetctl.controller.models import Node


def queue_unvalidated(api: Api, node: str, pid: int) -> None:
    """Queue a beat whose value validation would refuse (as if a bound were missed): the buffer's defence
    in depth is what is under test, not the contract's bounds."""
    good = HeartbeatRequest.model_validate({"node": node, "generation": 0, "engines": [
        {"name": "e0", "model": "m", "class_ref": "m@r1", "role": "mixed", "state": "ready", "pid": 100, "port": 1}]})
    good.engines[0].__dict__["pid"] = pid  # past validation, as a missed bound would be
    assert api.runtime.heartbeats.accept(good, api.clock()) is not None


def heartbeat_at(api: Api, node: str) -> datetime:
    with api.runtime.store.session() as session:
        return session.execute(select(Node.last_heartbeat_at).where(Node.name == node)).scalar_one()


def test_a_beat_the_store_refuses_is_dropped_and_the_others_are_written(api: Api) -> None:
    for node in ("good", "evil"):
        register(api, node)
        beat(api, node)  # the synchronous path primes the cache
    before = heartbeat_at(api, "good")
    api.clock.advance(3)
    beat(api, "good")  # queued
    queue_unvalidated(api, "evil", 10**23)
    assert api.runtime.heartbeats.pending == 2

    status = api.call("GET", "/api/v1/status", role="viewer")  # reads flush first
    assert status.status_code == 200, status.text
    assert api.runtime.heartbeats.pending == 0
    assert heartbeat_at(api, "good") > before  # written despite its neighbour
    exposition = api.call("GET", "/metrics", role=None).text
    dropped_lines = [line for line in exposition.splitlines() if line.startswith("fleet_controller_heartbeat_dropped_total{")]
    assert len(dropped_lines) == 1 and dropped_lines[0].endswith(" 1.0")
    events = api.call("GET", "/api/v1/audit", role="viewer").json()
    dropped = [e for e in events if e["code"] == "heartbeat_dropped"]
    assert [e["target"] for e in dropped] == ["evil"]
    assert dropped[0]["result"] == "error"
    # and the control plane keeps answering: reads and writes
    assert api.call("GET", "/api/v1/nodes", role="viewer").status_code == 200
    assert api.call("PUT", "/api/v1/flags/prefix_routing", role="operator", json={"value": False, "reason": "t"}).status_code == 200


def test_a_failing_flush_never_turns_other_calls_into_errors(api: Api) -> None:
    register(api, "evil")
    beat(api, "evil")
    for _ in range(3):  # the same bad value arriving on every beat
        queue_unvalidated(api, "evil", 10**23)
        assert api.call("GET", "/api/v1/status", role="viewer").status_code == 200
    assert dropped_total(api) == 3


def dropped_total(api: Api) -> float:
    """fleet_controller_heartbeat_dropped_total over every reason, as /metrics serves it."""
    samples = parse_samples(api.call("GET", "/metrics", role=None).text)
    return sum_series(samples, "fleet_controller_heartbeat_dropped_total")
