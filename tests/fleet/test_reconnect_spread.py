"""Twenty agents' heartbeat loops (in this process, each with its own real client) lose a real controller
at the same moment. Full-jitter backoff must spread their retries instead of sending them in lockstep, and
spread their reconnects once the controller is back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import kill

from agent.backoff import Backoff
from agent.heartbeat import HeartbeatLoop
from agent.ports import free_port
from fleetctl.client import AsyncControllerClient
from fleetctl.localfleet import processes
from fleetctl.localfleet.fleet import controller_command, controller_up

pytestmark = pytest.mark.slow

AGENTS = 20
BACKOFF = Backoff(base=1.0, cap=8.0)


class RecordingLink:
    """The real client, with the time and outcome of every call written down."""

    def __init__(self, client: AsyncControllerClient):
        self.client = client
        self.calls: list[tuple[float, bool]] = []

    async def register_agent(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._timed(self.client.register_agent(payload))

    async def heartbeat(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._timed(self.client.heartbeat(payload))

    async def _timed(self, call: Any) -> Any:
        started = time.monotonic()
        try:
            result = await call
        except Exception:
            self.calls.append((started, False))
            raise
        self.calls.append((started, True))
        return result

    def first_failure_and_retry(self, after: float) -> tuple[float, float]:
        """When the first call after `after` failed, and when the next call (the first retry) started."""
        later = [(t, ok) for t, ok in self.calls if t >= after]
        index = next(i for i, (_, ok) in enumerate(later) if not ok)
        return later[index][0], later[index + 1][0]

    def first_success(self, after: float) -> float:
        return next(t for t, ok in self.calls if t >= after and ok)


def busiest_window(times: list[float], width_s: float) -> int:
    """The most calls that fall within any window of `width_s`."""
    times = sorted(times)
    return max(sum(1 for u in times[i:] if u - t < width_s) for i, t in enumerate(times))


async def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def start_controller(state_dir: Path, port: int) -> processes.ProcessInfo:
    argv, env = controller_command(state_dir, port, heartbeat_interval_s=1.0)
    return processes.start("controller", "controller", argv, state_dir / "controller.log", env)


async def test_twenty_agents_spread_their_retries_and_reconnects(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    controller = start_controller(tmp_path, port)
    links: list[RecordingLink] = []
    try:
        await asyncio.to_thread(_wait_up, url, controller)
        token = (tmp_path / "bootstrap-token").read_text().strip()
        links = [RecordingLink(AsyncControllerClient(url, token=token, timeout=2.0)) for _ in range(AGENTS)]
        loops = [
            HeartbeatLoop(link, registration=_registration(i), observe=list, on_assignment=lambda g, a: None, backoff=BACKOFF)
            for i, link in enumerate(links)
        ]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
        await wait_for(lambda: all(loop.status.connected for loop in loops), 30, "all agents connected")

        outage = time.monotonic()
        await asyncio.to_thread(kill, controller)
        await wait_for(lambda: all(loop.status.failures >= 2 for loop in loops), 30, "every agent to retry")
        restarted = time.monotonic()
        controller = start_controller(tmp_path, port)
        await wait_for(lambda: all(loop.status.connected for loop in loops), 120, "all agents reconnected")
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        for link in links:
            await link.client.aclose()
        processes.stop_all([controller], timeout_s=10)

    # They lost the controller together; their first retries are spread over the first backoff window.
    first = [link.first_failure_and_retry(outage) for link in links]
    failures = [failed for failed, _ in first]
    retries = [retry for _, retry in first]
    delays = [retry - failed for failed, retry in first]
    assert max(failures) - min(failures) < BACKOFF.window(0)  # one crowd, failing within one heartbeat
    assert max(delays) - min(delays) > 0.3 * BACKOFF.window(0), delays
    assert busiest_window(retries, 0.1) <= AGENTS // 2, sorted(retries)
    # Back up, the controller is not stampeded: reconnects arrive spread out, not in one burst.
    reconnects = [link.first_success(restarted) for link in links]
    assert max(reconnects) - min(reconnects) > 0.5, sorted(reconnects)
    assert busiest_window(reconnects, 0.1) <= AGENTS // 2, sorted(reconnects)
    # and each agent told the controller how long it had been cut off
    assert all(loop.status.last_cut_off_s and loop.status.last_cut_off_s > 0 for loop in loops)


def _wait_up(url: str, info: processes.ProcessInfo) -> None:
    deadline = time.monotonic() + 60
    while not controller_up(url):
        assert processes.exit_status(info) is None, f"the controller exited; see {info.log_path}"
        assert time.monotonic() < deadline, "the controller did not come up"
        time.sleep(0.2)


def _registration(index: int) -> dict[str, Any]:
    return {"node": f"spread-{index:02d}", "url": f"http://127.0.0.1:{9000 + index}", "labels": {},
            "capacity": {"engines": 1, "kv_mib": 64}, "agent_version": "test"}
