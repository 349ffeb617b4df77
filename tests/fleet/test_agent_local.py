"""The agent on its own: the break-glass API (admin token, constant-time compare) works with the controller
down, and a restarted agent re-adopts the engines its predecessor left running."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psutil
import pytest
from fleet_helpers import (
    agents, complete, converged, engines_by_name, kill, process, restart_controller, wait_until,
)

from agent.client import AgentApiError, AgentClient
from fleetctl.localfleet import processes

pytestmark = pytest.mark.slow


def admin_token(fleet, node: str) -> str:
    return (Path(fleet.state_dir) / "agents" / node / "admin-token").read_text().strip()


def engine_on(fleet, node: str) -> dict:
    return next(e for e in engines_by_name(fleet).values() if e["node"] == node)


def test_break_glass_needs_the_admin_token(tiny_fleet):
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    url = process(tiny_fleet, "agent", "node-1").url
    name = engine_on(tiny_fleet, "node-1")["name"]
    assert httpx.post(f"{url}/engines/{name}/stop").status_code == 401
    wrong = httpx.post(f"{url}/engines/{name}/stop", headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "bad_credential"
    token = admin_token(tiny_fleet, "node-1")
    with pytest.raises(AgentApiError) as err:
        AgentClient(url, admin_token=token).act("no-such-engine", "stop")
    assert err.value.status == 404
    with pytest.raises(AgentApiError) as err:
        AgentClient(url, admin_token=token).act(name, "explode")
    assert err.value.status == 404
    assert engine_on(tiny_fleet, "node-1")["state"] == "ready"  # nothing happened


def test_break_glass_stop_and_restart_with_the_controller_down(tiny_fleet):
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    kill(process(tiny_fleet, "controller"))
    client = AgentClient(process(tiny_fleet, "agent", "node-1").url, admin_token=admin_token(tiny_fleet, "node-1"))
    name = engine_on(tiny_fleet, "node-1")["name"]

    client.act(name, "stop")
    wait_until(lambda: engine_on(tiny_fleet, "node-1")["state"] == "stopped", 60, "the engine to stop")
    time.sleep(3)  # several supervisor passes: the assignment still says "run", the operator's stop holds
    assert engine_on(tiny_fleet, "node-1")["state"] == "stopped"

    client.act(name, "restart")
    engine = wait_until(lambda: (e := engine_on(tiny_fleet, "node-1"))["state"] == "ready" and e, 60, "the restart")
    assert engine["restarts"] == 1 and complete(engine["url"])["choices"]

    restart_controller(tiny_fleet)
    wait_until(lambda: converged(tiny_fleet, replicas=2), 90, "the fleet to converge")


def test_restarted_agent_re_adopts_running_engines(tiny_fleet):
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    before = engine_on(tiny_fleet, "node-2")
    old = process(tiny_fleet, "agent", "node-2")
    argv = psutil.Process(old.pid).cmdline()
    kill(old)
    assert complete(before["url"])["choices"]  # the engine outlives its agent

    new = processes.start("agent", "node-2", argv, Path(old.log_path or "agent.log"), url=old.url)
    tiny_fleet.processes[tiny_fleet.processes.index(old)] = new
    tiny_fleet.save()
    wait_until(lambda: _ready(new.url), 60, "the new agent to report the engine ready")
    after = engine_on(tiny_fleet, "node-2")
    assert (after["name"], after["pid"], after["url"], after["restarts"]) == (
        before["name"], before["pid"], before["url"], before["restarts"])
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "the fleet to converge")
    assert engine_on(tiny_fleet, "node-2")["pid"] == before["pid"]


def _ready(url: str) -> bool:
    try:
        return any(e["state"] == "ready" for e in AgentClient(url).engines())
    except AgentApiError:
        return False


def test_agent_sigterm_stops_its_engines(tiny_fleet):
    """Last in this module: the graceful exit stops engines (unless --keep-engines-on-exit)."""
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    engine = engine_on(tiny_fleet, "node-1")
    info = process(tiny_fleet, "agent", "node-1")
    outcome = processes.stop_all([info], timeout_s=60)
    assert outcome == {"node-1": "stopped"}
    assert not psutil.pid_exists(engine["pid"]) or psutil.Process(engine["pid"]).status() == psutil.STATUS_ZOMBIE
    assert not list((Path(tiny_fleet.state_dir) / "agents" / "node-1" / "engines").glob("*.json"))
    assert agents(tiny_fleet)  # the other agent is still there for teardown
