"""The data plane outlives the control plane: with the controller killed, engines keep answering and agents
keep them running; once it is back, agents reconnect (reporting how long they were cut off) and the fleet
converges with nothing lost: same engines, same processes, no restarts."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fleet_helpers import (
    Traffic, agents, controller, converged, engines_by_name, kill, process, restart_controller, wait_until,
)

pytestmark = pytest.mark.slow


def test_engines_serve_through_a_controller_outage_and_the_fleet_reconverges(tiny_fleet):
    before = wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    processes_before = {name: (e["pid"], e["restarts"]) for name, e in engines_by_name(tiny_fleet).items()}

    with Traffic([e["url"] for e in before.values()]) as traffic:
        kill(process(tiny_fleet, "controller"))
        # the agents notice, and keep going
        for client in agents(tiny_fleet).values():
            wait_until(lambda c=client: not c.health()["controller"]["connected"], 30, "agents to notice the outage")
        served_during_outage = traffic.ok
        wait_until(lambda: traffic.ok >= served_during_outage + 10, 60, "requests served while the controller is down")
        cut_off = [c.health()["controller"]["cut_off_s"] for c in agents(tiny_fleet).values()]
        assert all(seconds is not None and seconds > 0 for seconds in cut_off)
        assert {n: (e["pid"], e["restarts"]) for n, e in engines_by_name(tiny_fleet).items()} == processes_before

        restart_controller(tiny_fleet)
        # each agent tells the controller how long it was cut off, on its first beat back (the node row holds
        # the latest beat's value, so watch for it)
        reported = wait_until(cut_off_watch(tiny_fleet), 90, "both agents to report their cut-off", every_s=0.1)
        assert all(seconds > 0 for seconds in reported.values())
        for client in agents(tiny_fleet).values():
            wait_until(lambda c=client: c.health()["controller"]["connected"], 30, "agents to reconnect")
        time.sleep(0.5)  # a few more requests after the reconnect
    assert traffic.failed == [], f"{len(traffic.failed)} of {traffic.ok + len(traffic.failed)} requests failed"

    after = wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "the fleet to converge again")
    assert {name: (e["node"], e["url"]) for name, e in after.items()} == {
        name: (e["node"], e["url"]) for name, e in before.items()}
    assert {n: (e["pid"], e["restarts"]) for n, e in engines_by_name(tiny_fleet).items()} == processes_before
    with controller(tiny_fleet) as api:
        assert all(node.state == "up" for node in api.list_nodes())
    for client in agents(tiny_fleet).values():
        assert client.health()["controller"]["last_cut_off_s"] > 0


def cut_off_watch(record) -> Callable[[], dict[str, float] | None]:
    """A probe: nodes whose cut_off_s the controller has shown so far; all of them, or None yet."""
    seen: dict[str, float] = {}

    def probe() -> dict[str, float] | None:
        with controller(record) as api:
            seen.update({node.name: node.cut_off_s for node in api.list_nodes() if node.cut_off_s})
        return dict(seen) if len(seen) == len(record.of_kind("agent")) else None

    return probe
