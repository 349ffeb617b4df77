"""Drains and engine cordons from the CLI: a drain is marked, then the CLI polls engine states until they
stopped; a cordon is stored, then the CLI waits for the gateways.
A minimal agent loop (real HTTP heartbeats) stands in for the agent: it reports assigned engines ready,
and drained ones draining, then stopped."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import Fleet, class_file, ok, one_error_line

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.client import ControllerClient


def report(assignment: dict[str, Any], seen_draining: set[str]) -> dict[str, Any]:
    if assignment["drain"]:
        state = "stopped" if assignment["name"] in seen_draining else "draining"
        seen_draining.add(assignment["name"])
    else:
        state = "ready"
    return {"name": assignment["name"], "model": assignment["model"], "class_ref": assignment["class_ref"],
            "role": assignment["role"], "state": state, "url": "http://127.0.0.1:1", "metrics": {}}


@contextmanager
def agent(fleet: Fleet, node: str) -> Iterator[None]:
    stop = threading.Event()
    client = ControllerClient(fleet.server.url, fleet.tokens["agent"])
    client.register_agent({"node": node, "url": f"http://{node}", "labels": {}, "capacity": {"engines": 2, "kv_mib": 1},
                           "agent_version": "test"})

    def loop() -> None:
        generation, engines, seen = 0, [], set()
        while not stop.is_set():
            reply = client.heartbeat({"node": node, "generation": generation, "engines": engines, "cut_off_s": None})
            generation = reply.generation
            engines = [report(a.model_dump(), seen) for a in reply.assignment]
            stop.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        client.close()


def deploy(fleet: Fleet, tmp_path: Path, replicas: int) -> None:
    ok(fleet.run("class", "apply", "-f", class_file(tmp_path)))
    ok(fleet.run("deploy", "set", "chat", "--class", "chat@r1", "--replicas", str(replicas)))


def wait_ready(fleet: Fleet, count: int) -> None:
    with fleet.client() as client:
        for _ in range(400):
            if sum(e.state == "ready" for e in client.list_engines()) >= count:
                return
            threading.Event().wait(0.05)
    pytest.fail("engines did not become ready")


def test_node_drain_waits_until_engines_stopped(fleet: Fleet, tmp_path: Path) -> None:
    with agent(fleet, "n1"), agent(fleet, "n2"):
        deploy(fleet, tmp_path, 2)
        wait_ready(fleet, 2)
        result = ok(fleet.run("node", "drain", "n1", "--yes", "--timeout", "30", "--reason", "maintenance"))
        assert "node n1: drained" in result.stderr
        with fleet.client() as client:
            node = client.get_node("n1")
            assert node.cordoned and node.draining
            wait_ready(fleet, 2)  # the replacement runs on n2
            assert {e.node for e in client.list_engines() if e.state == "ready"} == {"n2"}


def test_engine_drain_waits_until_stopped(fleet: Fleet, tmp_path: Path) -> None:
    with agent(fleet, "n1"):
        deploy(fleet, tmp_path, 1)
        wait_ready(fleet, 1)
        result = ok(fleet.run("engine", "drain", "chat-0", "--yes"))
        assert "engine chat-0: drained" in result.stderr


def test_drain_without_an_agent_times_out_or_returns_at_once(fleet: Fleet, tmp_path: Path) -> None:
    with fleet.client("agent") as client:
        client.register_agent({"node": "n1", "url": "http://n1", "labels": {}, "capacity": {"engines": 1, "kv_mib": 1}})
    deploy(fleet, tmp_path, 1)
    fleet.server.runtime.step()
    ok(fleet.run("node", "drain", "n1", "--yes", "--no-wait"))
    with fleet.client() as client:
        assert client.get_engine("chat-0").drain is True
    timed_out = fleet.run("node", "drain", "n1", "--yes", "--timeout", "0.3")
    assert timed_out.exit_code == ExitCode.ERROR
    assert "not drained after 0.3s; still running: chat-0" in one_error_line(timed_out, after_progress=True)


def test_engine_cordon_and_uncordon_from_the_cli(fleet: Fleet, tmp_path: Path) -> None:
    with agent(fleet, "n1"):
        deploy(fleet, tmp_path, 2)
        wait_ready(fleet, 2)
        # no gateway has reported: nothing to wait for, and the CLI says so
        result = ok(fleet.run("engine", "cordon", "chat-0", "--yes", "--reason", "suspect", "-o", "json"))
        assert "engine chat-0: cordoned (routing generation" in result.stderr
        assert "no gateways registered; nothing to wait for" in result.stderr
        shown = json.loads(result.stdout)
        assert (shown["name"], shown["cordoned"], shown["applied"]["gateways"]) == ("chat-0", True, [])
        assert "(already)" in ok(fleet.run("engine", "cordon", "chat-0", "--yes", "--no-wait")).stderr
        refused = fleet.run("engine", "cordon", "chat-1", "--yes")  # the last routable engine of chat@r1
        assert refused.exit_code != 0
        assert "the last routable engine of chat@r1" in one_error_line(refused)
        assert "engine chat-0: in traffic" in ok(fleet.run("engine", "uncordon", "chat-0", "--no-wait")).stderr
        with fleet.client() as client:
            assert [e.cordoned for e in client.list_engines()] == [False, False]
