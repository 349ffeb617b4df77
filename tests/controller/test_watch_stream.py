"""The change stream, `GET /api/v1/watch`, against a real controller on loopback (SQLite and PostgreSQL), its
hub ticked by the test: a snapshot of every kind first; a change through the API as a patch; resuming gets
exactly the missed deltas; an unknown or dropped token gets a snapshot; a reader that reads nothing
delays neither the ticks nor another viewer; a delta is serialised once whatever the number of viewers;
pings; auth, whoami, no audit entry, the hub's metrics, and shutdown ending the streams."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
from watch_helpers import NODE, WatchFleet, one_ready_engine, populate, watch_fleet

from fleetctl.controller.watch_contract import WATCH_KINDS, WatchDelta, WatchPing, WatchSnapshot
from fleetctl.errors import AuthError
from fleetctl.watch_state import FleetState

SHED = "shed_fraction:smollm2-135m"  # a flag whose value the tests change


@pytest.fixture
def fleet(db_url: str, tmp_path: Path):
    with watch_fleet(db_url, tmp_path) as fleet:
        yield fleet


def fresh_snapshot(fleet: WatchFleet) -> WatchSnapshot:
    viewer = fleet.viewer()
    snapshot = viewer.next()
    viewer.close()
    assert isinstance(snapshot, WatchSnapshot)
    return snapshot


def test_the_first_event_is_a_snapshot_of_every_kind(fleet: WatchFleet) -> None:
    engine = populate(fleet)
    snapshot = fresh_snapshot(fleet)
    assert snapshot.token == f"{fleet.hub.epoch}-0" and snapshot.ping_s == 60.0
    assert {kind for kind, values in snapshot.resources.items() if values} == set(WATCH_KINDS)
    state = FleetState()
    state.apply(snapshot)
    assert state.engines()[f"{NODE}/{engine}"].state == "ready"
    assert state.controller().replica == f"127.0.0.1:{fleet.server.settings.port}"
    assert state.pulse().engines_ready == 1 and state.pulse().flags == {"pd_push": False}
    assert list(state.flags()) == ["pd_push"] and state.flags()["pd_push"].value is False
    assert [d.fault for d in state.drills().values()] == ["rope_perturb"]
    assert [r.to_ref for r in state.rollouts().values()] == ["chat@r2"]
    assert state.traffic()["smollm2-135m"].weights == {"chat@r1": 1.0}
    assert "smollm2-135m/pinned/chat@r1/1" in state.canary_streams()
    assert state.gateways()["gw-1"].generation >= 1
    actions = [e.message.split()[0] for e in state.events if e.source == "audit"]
    assert {"class.apply", "traffic.set", "flag.set", "drill.start", "rollout.start"} <= set(actions)


def test_a_cordon_through_the_api_arrives_as_a_patch_and_folds_into_the_next_snapshot(fleet: WatchFleet) -> None:
    one_ready_engine(fleet)
    viewer = fleet.viewer()
    state = FleetState()
    state.apply(viewer.next())
    fleet.client("operator").cordon_node(NODE, reason="maintenance")
    assert fleet.tick() is True
    delta = viewer.next()
    assert isinstance(delta, WatchDelta) and delta.token == f"{fleet.hub.epoch}-1"
    node_changes = [c for c in delta.changes if c.kind == "node"]
    assert [(c.key, c.op, c.value["cordoned"]) for c in node_changes] == [(NODE, "patch", True)]
    assert "name" not in node_changes[0].value  # a patch carries only what changed
    (event,) = delta.events
    assert (event.source, event.severity, event.subject) == ("audit", "info", NODE)
    assert event.message == f"node.cordon {NODE}: maintenance" and event.actor.startswith("test-operator")
    state.apply(delta)
    assert state.nodes()[NODE].cordoned is True
    assert state.resources == fresh_snapshot(fleet).resources  # the deltas fold into what a snapshot holds
    viewer.close()


def test_a_tick_that_changes_nothing_sends_nothing(fleet: WatchFleet) -> None:
    one_ready_engine(fleet)
    fresh_snapshot(fleet)
    assert [fleet.tick() for _ in range(3)] == [False, False, False]
    assert fleet.hub.seq == 0 and fleet.hub.counters.deltas == 0


def test_resuming_with_the_last_token_gets_exactly_the_missed_deltas(fleet: WatchFleet) -> None:
    one_ready_engine(fleet)
    operator = fleet.client("operator")
    viewer = fleet.viewer()
    state = FleetState()
    state.apply(viewer.next())
    operator.set_flag(SHED, 0.1, reason="test")
    fleet.tick()
    state.apply(viewer.next())
    viewer.close()  # the viewer goes away; two changes happen meanwhile
    for value in (2, 3):
        operator.set_flag(SHED, value / 10, reason="test")
        fleet.tick()
    back = fleet.viewer(resume=state.token)
    missed = back.take(2)
    assert [type(m) for m in missed] == [WatchDelta, WatchDelta]
    assert [m.token for m in missed] == [f"{fleet.hub.epoch}-2", f"{fleet.hub.epoch}-3"]
    for message in missed:
        assert not state.apply(message).reset
    assert state.flags()[SHED].value == 0.3 and state.snapshots == 1
    assert state.resources == fresh_snapshot(fleet).resources
    assert fleet.hub.counters.resumes == 1
    back.close()


@pytest.mark.parametrize("token", ["nonsense", "deadbeef-1", None])
def test_an_unknown_token_gets_a_snapshot(fleet: WatchFleet, token: str | None) -> None:
    one_ready_engine(fleet)
    viewer = fleet.viewer(resume=token or f"{fleet.hub.epoch}-99")  # None: this epoch, a seq not reached
    assert isinstance(viewer.next(), WatchSnapshot)
    viewer.close()


def test_a_token_whose_deltas_were_dropped_gets_a_snapshot(db_url: str, tmp_path: Path) -> None:
    with watch_fleet(db_url, tmp_path, watch_history_mib=0.0001) as fleet:  # ~100 bytes: the newest delta only
        one_ready_engine(fleet)
        first = fresh_snapshot(fleet)
        operator = fleet.client("operator")
        for value in (1, 2, 3):
            operator.set_flag(SHED, value / 10, reason="test")
            fleet.tick()
        assert fleet.hub.counters.dropped == 2
        old = fleet.viewer(resume=first.token)
        snapshot = old.next()
        assert isinstance(snapshot, WatchSnapshot) and snapshot.token == f"{fleet.hub.epoch}-3"
        assert snapshot.resources["flag"][SHED]["value"] == 0.3
        old.close()
        latest = fleet.viewer(resume=f"{fleet.hub.epoch}-2")  # the delta after it is still held
        assert latest.next().token == f"{fleet.hub.epoch}-3"
        operator.set_flag(SHED, 0.4, reason="test")
        fleet.tick()
        assert latest.next().token == f"{fleet.hub.epoch}-4"
        latest.close()


def raw_viewer(fleet: WatchFleet) -> socket.socket:
    """A connection that asks for the stream and never reads a byte of it."""
    sock = socket.create_connection((fleet.server.settings.host, fleet.server.settings.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = (f"GET /api/v1/watch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {fleet.tokens['viewer']}\r\n\r\n")
    sock.sendall(request.encode())
    return sock


def wait_for_viewers(fleet: WatchFleet, n: int) -> None:
    deadline = time.monotonic() + 20
    while fleet.hub.viewers != n:
        assert time.monotonic() < deadline, f"{fleet.hub.viewers} viewers, not {n}"
        time.sleep(0.01)


def test_a_reader_that_reads_nothing_delays_neither_the_ticks_nor_another_viewer(fleet: WatchFleet) -> None:
    one_ready_engine(fleet)
    operator = fleet.client("operator")
    slow = raw_viewer(fleet)
    try:
        wait_for_viewers(fleet, 1)
        viewer = fleet.viewer()
        viewer.next()
        ticks = fleet.hub.counters.ticks
        for value in range(40):
            # 40 deltas of ~2 kB (the override's reason) pile up for the slow one
            operator.set_flag(SHED, value / 100, reason="x" * 1900 + str(value))
            assert fleet.tick() is True
            assert viewer.next().token == f"{fleet.hub.epoch}-{value + 1}"
        assert fleet.hub.counters.ticks == ticks + 40
        assert fleet.hub.viewers == 2
        viewer.close()
    finally:
        slow.close()


def test_each_delta_is_serialised_once_whatever_the_number_of_viewers(fleet: WatchFleet) -> None:
    one_ready_engine(fleet)
    fleet.tick()
    serialised = fleet.hub.counters.snapshot_serialisations
    viewers = [fleet.viewer() for _ in range(3)]
    assert len({v.next().token for v in viewers}) == 1
    assert fleet.hub.counters.snapshot_serialisations == serialised + 1  # one snapshot, cached for all three
    operator = fleet.client("operator")
    for value in range(5):
        operator.set_flag(SHED, value / 10, reason="test")
        fleet.tick()
    received = [[m.token for m in v.take(5)] for v in viewers]
    assert received[0] == received[1] == received[2] and len(set(received[0])) == 5
    assert fleet.hub.counters.delta_serialisations == fleet.hub.counters.deltas == 5
    metrics = fleet.client("viewer").metrics()
    assert "fleet_controller_watch_viewers 3.0" in metrics
    assert 'fleet_controller_watch_serialisations_total{kind="delta"} 5.0' in metrics
    for viewer in viewers:
        viewer.close()


def test_a_quiet_stream_pings_with_the_last_token(db_url: str, tmp_path: Path) -> None:
    with watch_fleet(db_url, tmp_path, watch_ping_s=0.2) as fleet:
        viewer = fleet.viewer()
        snapshot = viewer.next()
        ping = viewer.next()
        assert isinstance(ping, WatchPing) and ping.token == snapshot.token
        viewer.close()


def test_viewer_tokens_may_watch_no_token_is_401_and_an_agent_token_403(fleet: WatchFleet) -> None:
    viewer = fleet.viewer()
    assert isinstance(viewer.next(), WatchSnapshot)
    viewer.close()
    with pytest.raises(AuthError) as missing:
        fleet.viewer(role=None).next()  # type: ignore[arg-type]
    assert missing.value.status == 401
    with pytest.raises(AuthError) as agent:
        fleet.viewer(role="agent").next()
    assert agent.value.status == 403


def test_the_stream_is_an_uncached_event_stream_and_is_not_audited(fleet: WatchFleet) -> None:
    headers = {"Authorization": f"Bearer {fleet.tokens['viewer']}"}
    with httpx.stream("GET", f"{fleet.server.url}/api/v1/watch", headers=headers, timeout=20) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert next(response.iter_lines()).startswith(f"id: {fleet.hub.epoch}-")
    assert fleet.client("viewer").list_audit(limit=100) == []  # a GET changes nothing: not audited


def test_whoami_names_the_token_and_its_role(fleet: WatchFleet) -> None:
    for role in ("viewer", "operator", "admin"):
        me = fleet.client(role).whoami()
        assert (me.role, me.name.startswith(f"test-{role}")) == (role, True)


def test_stopping_the_controller_ends_open_streams(fleet: WatchFleet) -> None:
    viewer = fleet.viewer()
    viewer.next()
    fleet.server.stop()  # returns: the open stream does not hold the shutdown
    with pytest.raises(StopIteration):
        viewer.next()
