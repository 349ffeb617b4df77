"""Helpers of the process-level tests: start a tiny fleet, reach its controller and agents, wait, kill,
restart. The fleet is real: a controller (SQLite) and agents running tiny reference engines, started as
separate processes on loopback by the same code as `fleetctl up` (fleetctl/localfleet/)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from agent.client import AgentClient
from fleetctl.client import ControllerClient
from fleetctl.localfleet import FleetRecord, UpOptions, fleet, processes, up
from fleetctl.localfleet.processes import ProcessInfo

T = TypeVar("T")


def wait_until(probe: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.2) -> T:
    """Poll `probe` until it returns something truthy; fail the test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {value!r}")
        time.sleep(every_s)


def engine_port_base() -> int:
    """A random block of ports, so a run does not collide with another fleet on this machine."""
    return random.randrange(20_000, 40_000, 1_000)


def start_tiny_fleet(state_dir: Path, nodes: int = 2) -> FleetRecord:
    options = UpOptions(state_dir=state_dir, nodes=nodes, model="tiny", controller_port=0, gateway_port=0,
                        engine_port_base=engine_port_base(), heartbeat_interval_s=1.0, kv_cache_mib=16,
                        ready_timeout_s=240.0)
    return up(options, progress=lambda line: print(line, flush=True))


def controller(record: FleetRecord) -> ControllerClient:
    return ControllerClient(record.controller_url, token=Path(record.token_file).read_text().strip(), timeout=5.0)


def agents(record: FleetRecord) -> dict[str, AgentClient]:
    return {info.name: AgentClient(info.url or "") for info in record.of_kind("agent")}


def process(record: FleetRecord, kind: str, name: str | None = None) -> ProcessInfo:
    return next(p for p in record.processes if p.kind == kind and (name is None or p.name == name))


def engines_by_name(record: FleetRecord) -> dict[str, dict[str, Any]]:
    """Every engine as its agent reports it, with `node` added."""
    found = {}
    for node, client in agents(record).items():
        for engine in client.engines():
            found[engine["name"]] = {**engine, "node": node}
    return found


def complete(url: str, prompt: str = "hello", max_tokens: int = 8, timeout_s: float = 60.0) -> dict[str, Any]:
    """One completion; raises on any non-200."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout_s)
    response.raise_for_status()
    return response.json()


def converged(record: FleetRecord, replicas: int) -> dict[str, dict[str, Any]] | None:
    """The controller's engines when `replicas` are ready and nothing else is assigned, else None."""
    with controller(record) as api:
        engines = {e.name: e.model_dump() for e in api.list_engines()}
    ready = [e for e in engines.values() if e["state"] == "ready" and not e["drain"]]
    return engines if len(ready) == replicas == len(engines) else None


def kill(info: ProcessInfo) -> None:
    """SIGKILL one fleet process and wait until it is gone (reaped, when it is our child)."""
    os.kill(info.pid, signal.SIGKILL)
    wait_until(lambda: processes.exit_status(info) is not None or not processes.is_running(info), 10, f"{info.name} to die")


def restart_controller(record: FleetRecord) -> ProcessInfo:
    """Start the controller again on the same port and SQLite file, as an operator would; fleet.json follows."""
    return fleet.restart_controller(record, heartbeat_interval_s=1.0)


class Traffic:
    """Completions (`complete`) to each of `urls` (engines, or a gateway) in a loop on a thread, counting
    successes and failures."""

    def __init__(self, urls: list[str]):
        self.urls, self.ok, self.failed = urls, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Traffic":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                try:
                    complete(url, max_tokens=4)
                    self.ok += 1
                except Exception as exc:  # noqa: BLE001 - every failure is what the test counts
                    self.failed.append(f"{url}: {exc!r}")
