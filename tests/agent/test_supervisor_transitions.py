"""agent.engine_slot.transition: one engine slot's state machine, as a table and as properties.

Each row is (slot before, event, now) -> (slot after, effects). Log lines (`Report`) are left out of the table
and checked on their own below; every other effect is compared exactly, in order.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.backoff import Backoff
from agent.engine_slot import (
    LIVE_STATES, Abandon, Drain, DrainAnswered, Effect, Event, Exited, HealthChecked, MetricsScraped, OperatorRestart,
    RemoveRecord, Replace, Report, RequestDrain, Scrape, Signal, Slot, SlotPolicy, Spawn, Spawned, SpawnFailed, Start,
    StopNow, Tick, Unassign, adopted, is_forgettable, transition,
)
from agent.launch import PortBlock
from engine.contract import EngineAssignment, EngineMetrics


def upper(low: float, high: float) -> float:
    """The jitter pinned to the top of the window, so a delay is the window itself."""
    return high


POLICY = SlotPolicy(startup_timeout_s=600.0, unhealthy_after=3, stop_timeout_s=40.0, drain_timeout_s=60.0,
                    stable_after_s=60.0, restart_backoff=Backoff(base=1.0, cap=60.0), uniform=upper)


def assignment(class_ref: str = "tiny@r1", backend: str = "reference") -> EngineAssignment:
    return EngineAssignment(name="d-0", model="tiny", class_ref=class_ref, spec={"weights": "tiny", "backend": backend})


R1, R2, VLLM = assignment(), assignment("tiny@r2"), assignment("big@r1", backend="vllm")
PORTS, OTHER_PORTS = PortBlock(8100, 8101, 8102), PortBlock(8200, 8201, 8202)
LOAD = EngineMetrics(num_requests_running=3, kv_cache_usage_perc=0.5)
SIGTERM, SIGKILL = Signal(signal.SIGTERM), Signal(signal.SIGKILL)

STOPPED = Slot(assignment=R1, restarts=2)
LAUNCHING = replace(STOPPED, launching=True)
STARTING = Slot(assignment=R1, state="starting", pid=42, ports=PORTS, started_at=100.0)
READY = replace(STARTING, state="ready", ready_at=110.0, metrics=LOAD)
FAILED = Slot(assignment=R1, state="failed", ports=PORTS, last_exit="exit 1", crash_streak=1, retry_at=101.0)
STOPPING = replace(READY, state="draining", intent="stop", sigterm_sent=True, escalate_at=240.0)
DRAINING = replace(READY, state="draining", intent="drain", escalate_at=260.0)
RESTARTING = replace(READY, state="draining", intent="restart", pending=R2, sigterm_sent=True, escalate_at=240.0)


@dataclass(frozen=True)
class Row:
    id: str
    before: Slot
    event: Event
    now: float
    after: Slot
    effects: list[Effect]


ROWS = [
    # the plan asks for the engine
    Row("start a stopped engine, keeping its restart count", STOPPED, Start(R1), 100.0,
        replace(STOPPED, launching=True), [Spawn(R1)]),
    Row("start while a process runs changes nothing", READY, Start(R1), 200.0, READY, []),
    Row("start while a spawn is out changes nothing", LAUNCHING, Start(R1), 100.0, LAUNCHING, []),
    Row("spawned: starting, with its pid and ports", LAUNCHING, Spawned(42, PORTS), 100.0,
        replace(LAUNCHING, launching=False, state="starting", pid=42, ports=PORTS, started_at=100.0), []),
    Row("a spawn answer nobody asked for is ignored", STOPPED, Spawned(42, PORTS), 100.0, STOPPED, []),
    Row("no free ports: failed, backoff from the first window", LAUNCHING, SpawnFailed("no 3 free ports", None), 100.0,
        replace(STOPPED, state="failed", last_exit="no 3 free ports", retry_at=101.0, crash_streak=1), []),
    Row("launch failure keeps the ports it picked", replace(LAUNCHING, ports=PORTS),
        SpawnFailed("launch failed: bad dtype", OTHER_PORTS), 100.0,
        replace(STOPPED, state="failed", ports=OTHER_PORTS, last_exit="launch failed: bad dtype", retry_at=101.0,
                crash_streak=1), []),
    Row("replace a running engine: SIGTERM, start the new assignment after it exits", READY, Replace(R2), 200.0,
        replace(READY, state="draining", intent="restart", pending=R2, sigterm_sent=True, escalate_at=240.0), [SIGTERM]),
    Row("replace a failed engine before its backoff has passed: wait", FAILED, Replace(R1), 100.5, FAILED, []),
    Row("replace a failed engine once its backoff has passed: same class counts a restart", FAILED, Replace(R1), 101.0,
        replace(FAILED, launching=True, restarts=1), [Spawn(R1)]),
    Row("replace a failed engine with another class: the count starts again", replace(FAILED, restarts=4), Replace(R2),
        101.0, replace(FAILED, launching=True, assignment=R2, restarts=0), [Spawn(R2)]),
    Row("replace while a spawn is out changes nothing", LAUNCHING, Replace(R2), 500.0, LAUNCHING, []),
    # the plan no longer wants it, or wants it drained
    Row("unassign a running engine: SIGTERM with a deadline", READY, Unassign(), 200.0, STOPPING, [SIGTERM]),
    Row("unassign a failed engine: stopped", FAILED, Unassign(), 200.0, replace(FAILED, state="stopped"), []),
    Row("drain a reference engine: ask it", READY, Drain(), 200.0,
        replace(READY, state="draining", intent="drain"), [RequestDrain()]),
    Row("drain a vLLM engine: SIGTERM is its graceful shutdown", replace(READY, assignment=VLLM), Drain(), 200.0,
        replace(READY, assignment=VLLM, state="draining", intent="drain", sigterm_sent=True, escalate_at=240.0), [SIGTERM]),
    Row("drain accepted: the drain deadline", replace(DRAINING, escalate_at=None), DrainAnswered(True), 200.0,
        DRAINING, []),
    Row("drain refused: SIGTERM with the stop deadline", replace(DRAINING, escalate_at=None), DrainAnswered(False), 200.0,
        replace(DRAINING, sigterm_sent=True, escalate_at=240.0), [SIGTERM]),
    Row("a drain answer after the operator stopped it changes nothing", STOPPING, DrainAnswered(True), 200.0, STOPPING, []),
    # the operator, or the agent shutting down
    Row("operator restart of a running engine: SIGTERM, then the same assignment", READY, OperatorRestart(), 200.0,
        replace(READY, state="draining", intent="restart", pending=R1, sigterm_sent=True, escalate_at=240.0), [SIGTERM]),
    Row("operator restart of a failed engine does not wait out the backoff", replace(FAILED, retry_at=1000.0),
        OperatorRestart(), 200.0, replace(FAILED, retry_at=1000.0, launching=True, restarts=1), [Spawn(R1)]),
    Row("operator restart while a spawn is out changes nothing", LAUNCHING, OperatorRestart(), 200.0, LAUNCHING, []),
    Row("stop now: SIGTERM with a deadline", READY, StopNow(), 200.0, STOPPING, [SIGTERM]),
    Row("stop now without a process changes nothing", FAILED, StopNow(), 200.0, FAILED, []),
    Row("abandon: SIGKILL and drop the record", STOPPING, Abandon(), 300.0,
        replace(STOPPING, escalate_at=None), [SIGKILL, RemoveRecord()]),
    Row("abandon without a process changes nothing", STOPPED, Abandon(), 300.0, STOPPED, []),
    # the process ended
    Row("a crash soon after ready: failed, the streak's next window", replace(READY, crash_streak=2),
        Exited("signal SIGKILL"), 120.0,
        replace(READY, state="failed", pid=None, ready_at=None, metrics=EngineMetrics(), last_exit="signal SIGKILL",
                retry_at=124.0, crash_streak=3), [RemoveRecord()]),
    Row("a crash after a stable run starts a new streak", replace(READY, crash_streak=5), Exited("exit 1"), 170.0,
        replace(READY, state="failed", pid=None, ready_at=None, metrics=EngineMetrics(), last_exit="exit 1",
                retry_at=171.0, crash_streak=1), [RemoveRecord()]),
    Row("an expected exit: stopped, the ending's bookkeeping cleared", STOPPING, Exited("exit 0"), 210.0,
        replace(READY, state="stopped", pid=None, metrics=EngineMetrics(), last_exit="exit 0"), [RemoveRecord()]),
    Row("an exit with a restart pending starts the pending assignment", RESTARTING, Exited("exit 0"), 210.0,
        replace(READY, state="draining", pid=None, metrics=EngineMetrics(), last_exit="exit 0", assignment=R2,
                restarts=0, launching=True), [RemoveRecord(), Spawn(R2)]),
    Row("a killed engine's exit reports why it was killed", replace(STARTING, kill_reason="not healthy within 600s"),
        Exited("signal SIGKILL"), 700.0,
        replace(STARTING, state="failed", pid=None, last_exit="not healthy within 600s", retry_at=701.0,
                crash_streak=1), [RemoveRecord()]),
    Row("an exit without a process is ignored", STOPPED, Exited("exit 0"), 100.0, STOPPED, []),
    # probes
    Row("healthy while starting: ready", STARTING, HealthChecked(True), 110.0,
        replace(STARTING, state="ready", ready_at=110.0), []),
    Row("not healthy, still within the startup timeout: wait", STARTING, HealthChecked(False), 700.0, STARTING, []),
    Row("not healthy past the startup timeout: SIGKILL", STARTING, HealthChecked(False), 700.1,
        replace(STARTING, kill_reason="not healthy within 600s"), [SIGKILL]),
    Row("healthy while ready: failures reset, scrape", replace(READY, health_failures=2), HealthChecked(True), 200.0,
        READY, [Scrape()]),
    Row("a failed probe while ready counts, still scrapes", replace(READY, health_failures=1), HealthChecked(False),
        200.0, replace(READY, health_failures=2), [Scrape()]),
    Row("too many failed probes: SIGKILL", replace(READY, health_failures=2), HealthChecked(False), 200.0,
        replace(READY, health_failures=3, kill_reason="unhealthy: 3 failed health probes"), [SIGKILL]),
    Row("a probe answer for an engine already ending is ignored", STOPPING, HealthChecked(True), 200.0, STOPPING, []),
    Row("scraped metrics are kept", replace(READY, metrics=EngineMetrics()), MetricsScraped(LOAD), 200.0, READY, []),
    Row("metrics of an engine without a process are ignored", STOPPED, MetricsScraped(LOAD), 200.0, STOPPED, []),
    # deadlines
    Row("before the drain deadline: nothing", DRAINING, Tick(), 259.9, DRAINING, []),
    Row("drain deadline passed: SIGTERM", DRAINING, Tick(), 260.0,
        replace(DRAINING, sigterm_sent=True, escalate_at=300.0), [SIGTERM]),
    Row("SIGTERM deadline passed: SIGKILL", STOPPING, Tick(), 240.0, replace(STOPPING, escalate_at=None), [SIGKILL]),
    Row("no deadline: nothing", READY, Tick(), 10_000.0, READY, []),
]


def without_reports(effects: list[Effect]) -> list[Effect]:
    return [e for e in effects if not isinstance(e, Report)]


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_transition(row: Row) -> None:
    after, effects = transition(row.before, row.event, row.now, POLICY)
    assert after == row.after
    assert without_reports(effects) == row.effects


def reports(effects: list[Effect]) -> list[tuple[int, str]]:
    return [(e.level, e.message) for e in effects if isinstance(e, Report)]


def test_failures_kills_and_stops_are_logged() -> None:
    _, crashed = transition(READY, Exited("exit 1"), 120.0, POLICY)
    assert reports(crashed) == [(logging.WARNING, "engine d-0 failed (exit 1); restart in 1.0s")]
    _, killed = transition(STARTING, HealthChecked(False), 701.0, POLICY)
    assert reports(killed) == [(logging.WARNING, "killing engine d-0: not healthy within 600s")]
    _, stopped = transition(STOPPING, Exited("exit 0"), 210.0, POLICY)
    assert reports(stopped) == [(logging.INFO, "engine d-0 stopped (exit 0)")]
    _, started = transition(LAUNCHING, Spawned(42, PORTS), 100.0, POLICY)
    assert reports(started) == [(logging.INFO, "engine d-0 (tiny@r1, mixed) started: pid 42, port 8100")]


def test_an_adopted_process_is_probed_from_starting() -> None:
    slot = adopted(R1, pid=7, ports=PORTS, restarts=3, now=50.0)
    assert (slot.state, slot.pid, slot.ports, slot.restarts, slot.started_at) == ("starting", 7, PORTS, 3, 50.0)
    after, _ = transition(slot, HealthChecked(True), 51.0, POLICY)
    assert after.state == "ready"


def test_only_a_stopped_slot_without_a_process_is_forgotten() -> None:
    assert is_forgettable(STOPPED)
    assert not any(is_forgettable(s) for s in (LAUNCHING, STARTING, READY, FAILED, STOPPING))


# --- properties: a simulated world that answers every effect as the supervisor would ---


class World:
    """One slot and the OS around it: at most one process, answers to Spawn / RequestDrain / Scrape."""

    def __init__(self, spawn_ok: bool, engine_agrees: bool):
        self.slot = Slot(assignment=R1)
        self.alive: int | None = None
        self.next_pid = 1000
        self.spawn_ok, self.engine_agrees = spawn_ok, engine_agrees

    def feed(self, event: Event, now: float) -> None:
        self.slot, effects = transition(self.slot, event, now, POLICY)
        for effect in effects:
            if (answer := self._carry_out(effect)) is not None:
                self.feed(answer, now)

    def _carry_out(self, effect: Effect) -> Event | None:
        match effect:
            case Spawn():
                assert self.alive is None, "a second process for one slot"
                if not self.spawn_ok:
                    return SpawnFailed("launch failed", None)
                self.next_pid += 1
                self.alive = self.next_pid
                return Spawned(self.alive, PORTS)
            case RequestDrain():
                return DrainAnswered(self.engine_agrees)
            case Scrape():
                return MetricsScraped(LOAD)
        return None

    def process_exits(self, now: float) -> None:
        if self.alive is not None:
            self.alive = None
            self.feed(Exited("exit 1"), now)


MOVES = ("start", "replace", "unassign", "drain", "operator_restart", "stop_now", "abandon", "health", "tick", "exit")
moves = st.lists(st.tuples(st.sampled_from(MOVES), st.booleans(), st.floats(0.0, 120.0)), max_size=60)


def event_for(move: str, flag: bool) -> Event:
    target = R1 if flag else R2
    events: dict[str, Event] = {
        "start": Start(target), "replace": Replace(target), "unassign": Unassign(), "drain": Drain(),
        "operator_restart": OperatorRestart(), "stop_now": StopNow(), "abandon": Abandon(),
        "health": HealthChecked(flag), "tick": Tick(),
    }
    return events[move]


@given(moves, st.booleans(), st.booleans())
def test_a_slot_never_holds_two_processes_and_its_pid_matches_its_state(steps, spawn_ok, engine_agrees) -> None:
    world, now = World(spawn_ok, engine_agrees), 0.0
    for move, flag, dt in steps:
        now += dt
        if move == "exit":
            world.process_exits(now)
        else:
            world.feed(event_for(move, flag), now)
        slot = world.slot
        assert slot.pid == world.alive
        assert not slot.launching  # every spawn has been answered
        assert (slot.pid is not None) == (slot.state in LIVE_STATES)
        assert slot.intent is None or slot.state == "draining"


@given(st.lists(st.integers(0, 59), min_size=1, max_size=12), st.floats(0.0, 1.0))
def test_a_crash_loop_backs_off_monotonically_up_to_the_cap(uptimes, jitter) -> None:
    """Crash after crash, each before the engine has been ready for stable_after_s: the restart window
    doubles up to the cap, and the jittered delay stays inside it. (Whole seconds keep the window's sums exact.)"""
    policies = {"window": POLICY, "jittered": replace(POLICY, uniform=lambda low, high: low + jitter * (high - low))}
    for kind, policy in policies.items():
        slot, now, delays = Slot(assignment=R1), 0.0, []
        for uptime in uptimes:
            slot, _ = transition(slot, Replace(R1) if slot.state == "failed" else Start(R1), now, policy)
            slot, _ = transition(slot, Spawned(42, PORTS), now, policy)
            slot, _ = transition(slot, HealthChecked(True), now, policy)
            now += uptime
            slot, _ = transition(slot, Exited("exit 1"), now, policy)
            delays.append(slot.retry_at - now)
            now = slot.retry_at
        windows = [policy.restart_backoff.window(n) for n in range(len(uptimes))]
        assert all(-1e-9 <= d <= w + 1e-9 and w <= policy.restart_backoff.cap for d, w in zip(delays, windows))
        if kind == "window":
            assert delays == windows
            assert delays == sorted(delays)


@given(st.integers(0, 20), st.floats(60.0, 10_000.0))
def test_a_stable_run_forgets_the_crash_streak(streak, uptime) -> None:
    running = replace(READY, crash_streak=streak, ready_at=0.0)
    failed, _ = transition(running, Exited("exit 1"), uptime, POLICY)
    assert (failed.crash_streak, failed.retry_at - uptime) == (1, POLICY.restart_backoff.window(0))
