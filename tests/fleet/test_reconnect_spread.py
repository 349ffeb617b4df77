"""Twenty agents' heartbeat loops lose their controller at the same moment. Full-jitter backoff must spread
their retries instead of sending them in lockstep, and spread their reconnects once the controller is back.

The loops are the real `HeartbeatLoop`s; the controller is a simulated one that is up or down by simulated
time, and time itself is a discrete-event clock handed to every loop. Each agent draws its jitter from its
own seeded `random.Random`, so every retry time below is a fixed, reproducible number and the test asserts
the schedule, not how fast a machine runs it.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.backoff import Backoff
from agent.heartbeat import HeartbeatLoop
from fleetctl.controller.responses import HeartbeatResponse, RegisterResponse

AGENTS = 20
BACKOFF = Backoff(base=1.0, cap=8.0)
HEARTBEAT_S = 1.0
OUTAGE_AT = 10.5  # between two beats: every agent's next beat (t = 11.0) is its first failure
RESTART_AT = 30.0
END_AT = 60.0


@dataclass
class SimClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Call:
    at: float
    node: str
    ok: bool
    cut_off_s: float | None = None


@dataclass
class SimController:
    """Down in [OUTAGE_AT, RESTART_AT); every call any agent makes is written down with its simulated time."""

    clock: SimClock
    calls: list[Call] = field(default_factory=list)

    def up(self) -> bool:
        return not OUTAGE_AT <= self.clock.now < RESTART_AT

    def answer(self, node: str, reply: Any, cut_off_s: float | None = None) -> Any:
        ok = self.up()
        self.calls.append(Call(self.clock.now, node, ok, cut_off_s))
        if not ok:
            raise ConnectionRefusedError("controller down")
        return reply


@dataclass
class SimLink:
    """One agent's link to the simulated controller (the `ControllerLink` protocol)."""

    controller: SimController
    node: str

    async def register_agent(self, payload: dict[str, Any]) -> RegisterResponse:
        return self.controller.answer(self.node, RegisterResponse(node=self.node, heartbeat_interval_s=HEARTBEAT_S, generation=0))

    async def heartbeat(self, payload: dict[str, Any]) -> HeartbeatResponse:
        reply = HeartbeatResponse(generation=1, assignment=[], heartbeat_interval_s=HEARTBEAT_S)
        return self.controller.answer(self.node, reply, payload["cut_off_s"])


def make_loops(controller: SimController, clock: SimClock) -> list[HeartbeatLoop]:
    return [
        HeartbeatLoop(SimLink(controller, f"spread-{i:02d}"), registration={"node": f"spread-{i:02d}"},
                      observe=list, on_assignment=lambda g, a: None, backoff=BACKOFF,
                      uniform=random.Random(i).uniform, clock=clock)
        for i in range(AGENTS)
    ]


async def simulate(loops: list[HeartbeatLoop], clock: SimClock) -> None:
    """Run every loop until END_AT: each exchange happens at its simulated time, in time order, and the
    delay it returns schedules the next one (what `HeartbeatLoop.run` does with a real sleep)."""
    due = [(0.0, index) for index in range(len(loops))]  # every agent starts at once, so they beat in phase
    while due:
        at, index = heapq.heappop(due)
        if at >= END_AT:
            continue
        clock.now = at
        delay = await loops[index].exchange_or_backoff()
        heapq.heappush(due, (at + delay, index))


def calls_by_node(controller: SimController) -> dict[str, list[Call]]:
    by_node: dict[str, list[Call]] = {}
    for call in controller.calls:
        by_node.setdefault(call.node, []).append(call)
    return by_node


def busiest_window(times: list[float], width_s: float) -> int:
    """The most calls that fall within any window of `width_s`."""
    times = sorted(times)
    return max(sum(1 for u in times[i:] if u - t < width_s) for i, t in enumerate(times))


async def run_outage() -> tuple[list[HeartbeatLoop], dict[str, list[Call]]]:
    clock = SimClock()
    controller = SimController(clock)
    loops = make_loops(controller, clock)
    await simulate(loops, clock)
    return loops, calls_by_node(controller)


async def test_first_retries_of_a_crowd_are_spread_over_the_first_window():
    _, by_node = await run_outage()
    first_failures = [next(c for c in calls if not c.ok) for calls in by_node.values()]
    first_retries = [calls[calls.index(failure) + 1] for calls, failure in zip(by_node.values(), first_failures)]
    assert {failure.at for failure in first_failures} == {11.0}  # one crowd, failing in lockstep
    delays = [retry.at - 11.0 for retry in first_retries]
    assert all(0.0 <= delay <= BACKOFF.window(0) for delay in delays)
    assert max(delays) - min(delays) > 0.7 * BACKOFF.window(0), sorted(delays)
    assert busiest_window([retry.at for retry in first_retries], 0.1) <= AGENTS // 4, sorted(delays)


async def test_reconnects_after_the_restart_are_spread_out():
    loops, by_node = await run_outage()
    reconnects = [next(c for c in calls if c.ok and c.at >= RESTART_AT) for calls in by_node.values()]
    times = [call.at for call in reconnects]
    assert max(times) - min(times) > 0.5 * BACKOFF.cap, sorted(times)  # the last windows are the cap's
    assert busiest_window(times, 0.1) <= AGENTS // 4, sorted(times)
    assert all(loop.status.connected and loop.status.failures == 0 for loop in loops)


async def test_each_agent_reports_exactly_how_long_it_was_cut_off():
    loops, by_node = await run_outage()
    for loop, calls in zip(loops, by_node.values()):
        reconnect = next(c for c in calls if c.ok and c.at >= RESTART_AT)
        assert reconnect.cut_off_s == round(reconnect.at - 11.0, 3)  # from its first failure to this beat
        assert loop.status.last_cut_off_s == reconnect.cut_off_s
        after = [c for c in calls if c.at > reconnect.at]
        assert after and all(c.ok and c.cut_off_s is None for c in after)  # back on the heartbeat
        assert [b.at - a.at for a, b in zip(after, after[1:])] == pytest.approx([HEARTBEAT_S] * (len(after) - 1))


async def test_one_agents_retry_delays_follow_the_doubling_windows_of_its_random_source():
    loops, by_node = await run_outage()
    calls = by_node[loops[3].node]
    outage = [c for c in calls if not c.ok]
    retries = outage[1:] + [next(c for c in calls if c.ok and c.at >= RESTART_AT)]
    delays = [b.at - a.at for a, b in zip(outage, retries)]
    rng = random.Random(3)  # the same seed the loop was given: the same draws, in the same order
    expected = [rng.uniform(0.0, min(BACKOFF.cap, BACKOFF.base * 2**attempt)) for attempt in range(len(delays))]
    assert delays == pytest.approx(expected)
    assert len(delays) >= 5  # the outage is long enough to reach the cap
