"""The change stream across a controller restart, with real processes: `fleetctl controller serve` on loopback
and `follow()` in the test. It gets a snapshot and then the change an operator makes; when the controller
stops (Ctrl-C: it ends the open stream itself) it yields Disconnected; once the controller is back on the
same port it reconnects by itself, and since the new process cannot resume the old epoch's token it gets
a new snapshot, of the new epoch, holding the change."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleetctl.client import AsyncControllerClient, ControllerClient
from fleetctl.controller.server import free_port
from fleetctl.controller.testing import wait_healthy
from fleetctl.controller.watch_contract import WatchDelta, WatchSnapshot
from fleetctl.watch_client import Disconnected, follow

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0


def start_controller(state_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update({"FLEET_STATE_DIR": str(state_dir), "PYTHONPATH": str(REPO)})
    log = open(state_dir.parent / f"controller-{port}.log", "ab")  # noqa: SIM115 - kept open by the process
    process = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "controller", "serve", "--port", str(port),
                                "--watch-ping", "0.5", "--watch-tick", "0.2"], env=env, cwd=REPO, stdout=log, stderr=log)
    wait_healthy(f"http://127.0.0.1:{port}", process, timeout_s=WAIT_S)
    return process


async def next_item(stream: AsyncIterator[object]) -> object:
    return await asyncio.wait_for(anext(stream), WAIT_S)


def epoch(token: str) -> str:
    return token.rsplit("-", 1)[0]


async def test_follow_sees_changes_then_the_outage_then_a_new_epochs_snapshot(tmp_path: Path) -> None:
    state_dir, port = tmp_path / "state", free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_controller(state_dir, port)
    try:
        token = (state_dir / "bootstrap-token").read_text().strip()
        async with AsyncControllerClient(url, token) as client:
            stream = follow(client, uniform=lambda low, high: min(high, 0.2))
            first = await next_item(stream)
            assert isinstance(first, WatchSnapshot)
            with ControllerClient(url, token) as operator:
                operator.set_flag("pd_push", False, reason="test")
            item = await next_item(stream)
            while not (isinstance(item, WatchDelta) and any(c.kind == "flag" for c in item.changes)):
                item = await next_item(stream)
            assert [c.key for c in item.changes if c.kind == "flag"] == ["pd_push"]
            assert epoch(item.token) == epoch(first.token)

            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=WAIT_S) == 0  # the open stream did not hold the shutdown
            gap = await next_item(stream)
            while not isinstance(gap, Disconnected):  # pings or deltas sent before it stopped
                gap = await next_item(stream)

            process = start_controller(state_dir, port)
            again = await next_item(stream)
            while isinstance(again, Disconnected):  # tries made while it was starting
                again = await next_item(stream)
            assert isinstance(again, WatchSnapshot) and epoch(again.token) != epoch(first.token)
            assert again.resources["flag"]["pd_push"]["value"] is False
            await stream.aclose()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
