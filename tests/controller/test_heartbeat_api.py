"""The agent flow against the real store: register, heartbeat returns assignment and generation, the
generation moves only when the node's assignment changes; drains; nodes going down keep their engines."""

from __future__ import annotations

from ctl_helpers import Api, apply_class, beat, deploy, observed, register
from sqlalchemy import event, select

from fleetctl.controller.models import Engine, Node


def test_register_then_heartbeat_returns_assignment_and_generation(api: Api) -> None:
    assert register(api, "n1") == {"node": "n1", "heartbeat_interval_s": 5.0, "generation": 0}
    assert beat(api, "n1") == {"generation": 0, "assignment": [], "heartbeat_interval_s": 5.0,
                              "kv": {"disk": True, "flush": None}}
    ref = apply_class(api)["ref"]
    deploy(api, "chat", ref, 2)
    api.reconcile()
    reply = beat(api, "n1")
    assert reply["generation"] == 1
    assert [(a["name"], a["class_ref"], a["role"], a["drain"]) for a in reply["assignment"]] == [
        ("chat-0", "chat@r1", "mixed", False), ("chat-1", "chat@r1", "mixed", False)]
    assert reply["assignment"][0]["spec"]["weights"] == "smollm2"
    assert reply["assignment"][0]["model"] == "smollm2-135m"


def test_generation_is_unchanged_when_nothing_changed(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    first = beat(api, "n1")
    running = [observed(a, "ready") for a in first["assignment"]]
    for _ in range(3):
        api.reconcile()
        assert beat(api, "n1", first["generation"], running) == first
    deploy(api, "chat", "chat@r1", 2)  # a real change: +1
    api.reconcile()
    assert beat(api, "n1", first["generation"], running)["generation"] == first["generation"] + 1


def test_heartbeat_stores_observed_engines_for_that_node_only(api: Api) -> None:
    register(api, "n1")
    register(api, "n2")
    deploy(api, "chat", apply_class(api)["ref"], 2)
    api.reconcile()
    reply = beat(api, "n1")
    beat(api, "n1", reply["generation"], [observed(a, "ready") for a in reply["assignment"]])
    beat(api, "n2")
    engines = api.call("GET", "/api/v1/engines", role="viewer").json()
    states = {(e["name"], e["node"]): e["state"] for e in engines}
    assert states[(reply["assignment"][0]["name"], "n1")] == "ready"
    assert "pending" in states.values()  # n2's engine is assigned but not reported yet
    with api.runtime.store.session() as session:
        node = session.get(Node, "n1")
        assert node.applied_generation == reply["generation"]
        assert {e.node for e in session.execute(select(Engine)).scalars()} == {"n1"}


def test_heartbeat_from_an_unregistered_node_is_404(api: Api) -> None:
    response = api.call("POST", "/api/v1/agents/heartbeat", role="agent", json={"node": "ghost", "generation": 0})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "node_not_registered"


def test_missed_heartbeats_mark_the_node_down_but_keep_its_engines(api: Api) -> None:
    register(api, "n1")
    register(api, "n2")
    deploy(api, "chat", apply_class(api)["ref"], 2)
    api.reconcile()
    before = {n: beat(api, n)["assignment"] for n in ("n1", "n2")}
    api.clock.advance(10)
    beat(api, "n2")
    api.clock.advance(6)  # n1: 16 s without a heartbeat > 3 x 5 s
    result = api.reconcile()
    assert result.marked_down == ["n1"]
    nodes = {n["name"]: n for n in api.call("GET", "/api/v1/nodes", role="viewer").json()}
    assert nodes["n1"]["state"] == "down" and nodes["n2"]["state"] == "up"
    assert nodes["n1"]["heartbeat_age_s"] == 16.0
    for _ in range(3):  # nothing is moved away from the down node, however often we reconcile
        api.reconcile()
    with api.runtime.store.session() as session:
        assert session.get(Node, "n1").generation == 1
    assert beat(api, "n1")["assignment"] == before["n1"]  # it comes back with the same engines
    assert api.call("GET", "/api/v1/nodes/n1", role="viewer").json()["state"] == "up"


def test_cordon_blocks_new_engines_only(api: Api) -> None:
    register(api, "n1")
    register(api, "n2")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    holder = next(n for n in ("n1", "n2") if beat(api, n)["assignment"])
    other = "n2" if holder == "n1" else "n1"
    api.call("POST", f"/api/v1/nodes/{other}/cordon", role="operator")
    deploy(api, "chat", "chat@r1", 3)
    api.reconcile()
    assert len(beat(api, holder)["assignment"]) == 3
    assert beat(api, other)["assignment"] == []
    api.call("POST", f"/api/v1/nodes/{other}/uncordon", role="operator")
    deploy(api, "chat", "chat@r1", 4)
    api.reconcile()
    assert len(beat(api, other)["assignment"]) == 1


def test_node_drain_marks_assignments_and_replacements_follow(api: Api) -> None:
    register(api, "n1")
    register(api, "n2")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    holder = next(n for n in ("n1", "n2") if beat(api, n)["assignment"])
    other = "n2" if holder == "n1" else "n1"
    response = api.call("POST", f"/api/v1/nodes/{holder}/drain", role="operator", headers={"X-Fleet-Reason": "kernel%20upgrade"})
    assert response.status_code == 200 and response.json()["cordoned"] and response.json()["draining"]
    reply = beat(api, holder)  # the drain reaches the agent with no reconcile in between
    assert [a["drain"] for a in reply["assignment"]] == [True]
    api.reconcile()
    assert [a["drain"] for a in beat(api, other)["assignment"]] == [False]  # the replacement
    # the agent drains and stops the engine; once it says so, the assignment goes
    beat(api, holder, reply["generation"], [observed(a, "stopped") for a in reply["assignment"]])
    api.reconcile()
    assert beat(api, holder)["assignment"] == []
    event = api.call("GET", "/api/v1/audit", role="viewer").json()[-1]
    assert (event["action"], event["target"], event["reason"]) == ("node.drain", holder, "kernel upgrade")


def test_engine_drain(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    generation = beat(api, "n1")["generation"]
    drained = api.call("POST", "/api/v1/engines/chat-0/drain", role="operator")
    assert drained.status_code == 200 and drained.json()["drain"] is True
    reply = beat(api, "n1")
    assert reply["generation"] == generation + 1
    assert [(a["name"], a["drain"]) for a in reply["assignment"]] == [("chat-0", True)]
    again = api.call("POST", "/api/v1/engines/chat-0/drain", role="operator")
    assert again.json()["result"] == "unchanged"
    api.reconcile()
    assert [(a["name"], a["drain"]) for a in beat(api, "n1")["assignment"]] == [("chat-0", True), ("chat-1", False)]
    assert api.call("POST", "/api/v1/engines/nope-0/drain", role="operator").status_code == 404


def test_deleting_a_deployment_drains_its_engines(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 2)
    api.reconcile()
    assert api.call("DELETE", "/api/v1/deployments/chat", role="operator").status_code == 200
    api.reconcile()
    assert [a["drain"] for a in beat(api, "n1")["assignment"]] == [True, True]
    assert api.call("DELETE", "/api/v1/deployments/chat", role="operator").status_code == 404


def test_placement_labels_through_the_api(api: Api) -> None:
    register(api, "cpu1", labels={"accel": "cpu"})
    register(api, "gpu1", labels={"accel": "h200"})
    deploy(api, "chat", apply_class(api)["ref"], 2, placement={"accel": "h200"})
    api.reconcile()
    assert beat(api, "cpu1")["assignment"] == []
    assert len(beat(api, "gpu1")["assignment"]) == 2


class StatementCounter:
    """Counts SQL statements the store executes (cost per call, independent of timing)."""

    def __init__(self, api: Api):
        self.engine = api.runtime.store.engine
        self.count = 0

    def __enter__(self) -> "StatementCounter":
        event.listen(self.engine, "before_cursor_execute", self._count)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._count)

    def _count(self, *_args: object) -> None:
        self.count += 1


def test_heartbeat_and_status_cost_does_not_grow_with_the_fleet(api: Api) -> None:
    register(api, "n0")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    engines = [observed(a, "ready") for a in beat(api, "n0")["assignment"]]

    def cost() -> tuple[int, int]:
        api.clock.advance(1)
        beat(api, "n0", 1, engines)  # after the changes below, the first beat and read refresh the caches
        api.call("GET", "/api/v1/status", role="viewer")
        with StatementCounter(api) as beat_cost:
            beat(api, "n0", 1, engines)
        with StatementCounter(api) as status_cost:
            api.call("GET", "/api/v1/status", role="viewer")
        return beat_cost.count, status_cost.count

    small = cost()
    for i in range(1, 200):
        register(api, f"n{i}")
    deploy(api, "chat", "chat@r1", 150)
    api.reconcile()
    assert cost() == small
