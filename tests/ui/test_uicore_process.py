"""The TUI on a real controller process: `make_app` with the real change stream (follow()). The first full
screen appears; the controller stops and the header goes stale within seconds; it starts again (same port,
same SQLite) and the TUI recovers by itself."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from agent.ports import free_port
from fleetctl.client import ControllerClient
from fleetctl.controller.paths import bootstrap_token_path
from fleetctl.localfleet import processes
from fleetctl.localfleet.fleet import HOST, controller_command, controller_up
from fleetctl.localfleet.processes import ProcessInfo
from ui.app import make_app
from ui.widgets.header import PulseHeader
from ui.widgets.table import VirtualTable

pytestmark = pytest.mark.slow

NODE = "tui-node-1"


class Controller:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.port = free_port(HOST)
        self.url = f"http://{HOST}:{self.port}"
        self.info: ProcessInfo | None = None

    def start(self) -> None:
        argv, env = controller_command(self.state_dir, self.port, heartbeat_interval_s=1.0)
        self.info = processes.start("controller", "controller", argv, self.state_dir / "controller.log", env, self.url)
        deadline = time.monotonic() + 60
        while not controller_up(self.url):
            assert time.monotonic() < deadline, (self.state_dir / "controller.log").read_text()[-2000:]
            time.sleep(0.2)

    def stop(self) -> None:
        if self.info is not None:
            processes.stop_all([self.info], timeout_s=10)
            self.info = None

    def token(self) -> str:
        return bootstrap_token_path(self.state_dir).read_text().strip()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    started = Controller(tmp_path)
    started.start()
    try:
        yield started
    finally:
        started.stop()


async def eventually(pilot: Pilot, probe: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await pilot.pause(0.2)


async def test_follows_a_real_controller_through_a_restart(controller: Controller) -> None:
    token = controller.token()
    with ControllerClient(controller.url, token) as api:
        api.register_agent({"node": NODE, "url": "http://127.0.0.1:1", "labels": {},
                            "capacity": {"engines": 2, "kv_mib": 1}, "agent_version": "test"})
    app = make_app(controller.url, token)
    async with app.run_test(size=(120, 30)) as pilot:
        table = app.screen.query_one(VirtualTable)
        header = app.screen.query_one(PulseHeader)
        await eventually(pilot, lambda: f"{NODE}/" in table.keys, 30, "the node's row")
        await eventually(pilot, lambda: app.fleet.controller() is not None, 10, "the controller in the header")
        assert not header.has_class("-stale")

        controller.stop()
        await eventually(pilot, lambda: header.has_class("-stale"), 10, "the header to go stale")
        assert app.stale_since is not None and f"{NODE}/" in table.keys  # the last known fleet stays shown

        controller.start()
        await eventually(pilot, lambda: not header.has_class("-stale"), 60, "the TUI to recover")
        assert app.stale_since is None and f"{NODE}/" in table.keys and app.fleet.snapshots >= 2
