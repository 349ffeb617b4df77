"""Heartbeats written behind (fleetctl/controller/heartbeats.py), against SQLite and PostgreSQL: a beat of a node
known to be up is answered from memory and stored in the next batch; reads through the controller see every
beat it accepted; a change reaches the agent on its next beat; a verified token is not looked up again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from ctl_helpers import Api, Clock, apply_class, beat, deploy, observed, register
from fastapi.testclient import TestClient
from sqlalchemy import event, select, update

from fleetctl.controller.api.app import create_app
from fleetctl.controller.models import Assignment, Engine, Node
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens


def statements(api: Api, call) -> int:
    count = 0

    def counted(*_args: object) -> None:
        nonlocal count
        count += 1

    event.listen(api.runtime.store.engine, "before_cursor_execute", counted)
    try:
        call()
    finally:
        event.remove(api.runtime.store.engine, "before_cursor_execute", counted)
    return count


def stored_heartbeat(api: Api, node: str):
    with api.runtime.store.session() as session:
        return session.execute(select(Node.last_heartbeat_at).where(Node.name == node)).scalar_one()


def test_an_up_nodes_beat_is_answered_from_memory_and_stored_by_the_next_flush(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    first = beat(api, "n1")  # the reconcile changed n1: the synchronous path, which primes the cache
    running = [observed(a, "ready") for a in first["assignment"]]
    before = stored_heartbeat(api, "n1")
    api.clock.advance(1)
    assert statements(api, lambda: beat(api, "n1", first["generation"], running)) == 0  # nor a token lookup
    assert api.runtime.heartbeats.pending == 1
    assert stored_heartbeat(api, "n1") == before  # not yet written
    engines = api.call("GET", "/api/v1/engines", role="viewer").json()  # reads flush first
    assert api.runtime.heartbeats.pending == 0
    assert [e["state"] for e in engines if e["node"] == "n1"] == ["ready"]
    assert stored_heartbeat(api, "n1").replace(tzinfo=None) == (before + timedelta(seconds=1)).replace(tzinfo=None)


def test_a_change_through_this_controller_reaches_the_agent_on_its_next_beat(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    first = beat(api, "n1")
    beat(api, "n1", first["generation"])  # cached now
    assert api.call("POST", "/api/v1/nodes/n1/drain", role="operator", params={"yes": True}).status_code == 200
    drained = beat(api, "n1", first["generation"])
    assert drained["generation"] == first["generation"] + 1 and all(a["drain"] for a in drained["assignment"])


def test_a_change_through_another_replica_arrives_with_the_next_refresh(api: Api) -> None:
    """Another controller replica writes the database directly; this one learns it when it next flushes."""
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    first = beat(api, "n1")
    beat(api, "n1", first["generation"])
    with api.runtime.store.session() as session:  # what a drain on another replica commits
        session.execute(update(Assignment).where(Assignment.node == "n1").values(drain=True))
        session.execute(update(Node).where(Node.name == "n1").values(generation=Node.generation + 1))
    assert beat(api, "n1", first["generation"]) == first  # still the cached reply
    api.runtime.flush_heartbeats()
    refreshed = beat(api, "n1", first["generation"])
    assert refreshed["generation"] == first["generation"] + 1 and all(a["drain"] for a in refreshed["assignment"])


def test_a_node_marked_down_comes_back_with_the_next_flush_and_wakes_the_reconciler(api: Api) -> None:
    register(api, "n1")
    beat(api, "n1")
    beat(api, "n1")
    api.clock.advance(16)  # > 3 x 5 s without a beat
    assert "n1" in api.reconcile().marked_down
    api.runtime._wake.clear()
    assert beat(api, "n1")["generation"] == 0  # answered from the cache: a down node keeps its assignment
    assert api.runtime.heartbeats.pending == 1
    nodes = {n["name"]: n for n in api.call("GET", "/api/v1/nodes", role="viewer").json()}
    assert nodes["n1"]["state"] == "up"
    assert api.runtime._wake.is_set()  # placement may change: the reconciler runs soon


def test_a_beat_of_a_deleted_node_is_dropped_then_refused(api: Api) -> None:
    register(api, "n1")
    beat(api, "n1")
    beat(api, "n1")
    with api.runtime.store.session() as session:
        session.execute(Engine.__table__.delete().where(Engine.node == "n1"))
        session.execute(Node.__table__.delete().where(Node.name == "n1"))
    beat(api, "n1")  # cached: accepted, then dropped by the flush (the node is gone)
    api.runtime.flush_heartbeats()
    with api.runtime.store.session() as session:
        assert session.get(Node, "n1") is None
    response = api.call("POST", "/api/v1/agents/heartbeat", role="agent", json={"node": "n1", "generation": 0})
    assert response.status_code == 404


def test_a_revoked_token_is_refused_at_once(api: Api) -> None:
    created = api.call("POST", "/api/v1/tokens", role="admin", json={"name": "agent-x", "role": "agent"})
    assert created.status_code in (200, 201), created.text
    token = created.json()["token"]
    register(api, "n1")
    headers = {"Authorization": f"Bearer {token}"}
    body = {"node": "n1", "generation": 0}
    assert api.call("POST", "/api/v1/agents/heartbeat", role=None, headers=headers, json=body).status_code == 200
    assert api.call("DELETE", "/api/v1/tokens/agent-x", role="admin", params={"yes": True}).status_code == 200
    refused = api.call("POST", "/api/v1/agents/heartbeat", role=None, headers=headers, json=body)
    assert refused.status_code == 401


def test_write_through_mode_stores_each_beat_at_once(db_url: str, tmp_path: Path) -> None:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", background=False, heartbeat_interval_s=5.0,
                                  heartbeat_flush_s=0)
    runtime = ControllerRuntime(settings, clock=Clock())
    with TestClient(create_app(runtime=runtime)) as http:
        api = Api(http, runtime, role_tokens(runtime.store), runtime.clock)  # type: ignore[arg-type]
        assert runtime.heartbeats is None
        register(api, "n1")
        before = stored_heartbeat(api, "n1")
        api.clock.advance(2)
        beat(api, "n1")
        beat(api, "n1")
        assert stored_heartbeat(api, "n1").replace(tzinfo=None) == (before + timedelta(seconds=2)).replace(tzinfo=None)


def test_engine_states_are_stored_at_once_and_metrics_every_few_seconds(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    assignment = beat(api, "n1")["assignment"][0]
    ready = observed(assignment, "ready")
    beat(api, "n1", 1, [ready])

    def stored() -> tuple[str, float]:
        engine = next(e for e in api.call("GET", "/api/v1/engines", role="viewer").json() if e["node"] == "n1")
        return engine["state"], engine["metrics"]["num_requests_running"]

    assert stored() == ("ready", 1)
    busier = observed(assignment, "ready")
    busier["metrics"]["num_requests_running"] = 7
    api.clock.advance(1)
    beat(api, "n1", 1, [busier])
    assert stored() == ("ready", 1)  # a metrics-only change waits for the refresh
    api.clock.advance(api.runtime.heartbeats.metrics_refresh_s)
    beat(api, "n1", 1, [busier])
    assert stored() == ("ready", 7)
    draining = observed(assignment, "draining")
    beat(api, "n1", 1, [draining])
    assert stored() == ("draining", 1)  # a state change is stored with its beat
