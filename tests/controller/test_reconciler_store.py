"""The reconciler against the real store: writes only changed nodes, and a drain that lands between the
snapshot and the write is never overwritten (compare-and-set on the node's generation)."""

from __future__ import annotations

from ctl_helpers import Api, apply_class, beat, deploy, register

from fleetctl.controller.nodes import drain_engine
from fleetctl.controller.placement import plan_assignments
from fleetctl.controller.reconciler import load_snapshot, write_assignment


def test_only_changed_nodes_are_written(api: Api) -> None:
    register(api, "n1")
    register(api, "n2")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    first = api.reconcile()
    assert len(first.changed) == 1
    assert api.reconcile().changed == []
    deploy(api, "chat", "chat@r1", 2)
    assert api.reconcile().changed == sorted({"n1", "n2"} - set(first.changed))


def test_a_concurrent_drain_is_not_lost(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    deploy(api, "chat", "chat@r1", 2)
    with api.runtime.store.session() as session:
        snapshot = load_snapshot(session)  # the reconciler reads...
    with api.runtime.store.session() as session:
        drain_engine(session, "chat-0")  # ...an operator drains chat-0 meanwhile...
    plan = plan_assignments(snapshot.deployments, snapshot.classes, snapshot.nodes)
    with api.runtime.store.session() as session:  # ...and the stale plan is refused
        assert write_assignment(session, "n1", snapshot.nodes[0].generation, plan["n1"]) is False
    api.runtime.flush_heartbeats()  # written past the API, as by another replica: seen from the next flush on
    assert {a["name"]: a["drain"] for a in beat(api, "n1")["assignment"]} == {"chat-0": True}
    api.reconcile()  # the next pass plans from the drained state
    assert {a["name"]: a["drain"] for a in beat(api, "n1")["assignment"]} == {"chat-0": True, "chat-1": False, "chat-2": False}
