"""One engine slot of the supervisor as a pure state machine: `transition(slot, event, now, policy)`.

A slot is everything the agent knows about one engine name: what it should run, which process (if any)
runs it, why that process is being asked to end, and when a crashed engine may be started again. The
supervisor (`agent.supervisor`) turns what it sees (a process ended, a health probe answered, the reconcile
plan asked for a start) into an `Event`, calls `transition`, stores the new `Slot` and carries out the
returned `Effect`s: spawn a process, signal it, ask it to drain, scrape its metrics, drop its record, log.
Nothing here reads a clock, touches a process or the network; `now` (monotonic seconds) is passed in and the
backoff's random source comes with the `SlotPolicy`.

Invariants, once the effects of an event (and the events they answer with) have been applied:
  - a slot holds at most one process: `Spawn` is emitted only while `pid is None` and no spawn is out;
  - `pid is not None` exactly when the state is starting, ready or draining;
  - an exit is expected (the engine is stopped or started again) when `intent` is set, a crash otherwise;
  - a crash loop backs off: the restart window doubles with each consecutive crash up to the policy's cap,
    and the streak is forgotten once an engine has stayed ready for `stable_after_s`.

Events that need an answer from the outside are answered by a follow-up event: `Spawn` by `Spawned` or
`SpawnFailed`, `RequestDrain` by `DrainAnswered`, `Scrape` by `MetricsScraped` (only when it succeeded).
`RequestDrain` and `Scrape` are the only effects that wait on the network; only `Drain` and `HealthChecked`
lead to them.
"""

from __future__ import annotations

import logging
import random
import signal
from dataclasses import dataclass, field, replace
from typing import Literal

from agent.backoff import RESTART_BACKOFF, Backoff, Uniform
from agent.launch import PortBlock, backend_of
from engine.contract import EngineAssignment, EngineMetrics, EngineState

Intent = Literal["stop", "drain", "restart"]
LIVE_STATES: frozenset[str] = frozenset({"starting", "ready", "draining"})  # the states that hold a process


@dataclass(frozen=True)
class Slot:
    """One engine name's state. Times are monotonic seconds."""

    assignment: EngineAssignment  # what it runs, or is about to run
    state: EngineState = "stopped"
    pid: int | None = None  # the process that runs it; None when none does
    ports: PortBlock | None = None  # kept after an exit, so a restart prefers the same block (and URL)
    launching: bool = False  # a Spawn is out; Spawned or SpawnFailed comes next
    restarts: int = 0  # restarts of the same class and role; a new class or role counts from 0
    last_exit: str | None = None  # how the last process ended, or why starting one failed
    crash_streak: int = 0  # consecutive crashes: the restart backoff's attempt number
    retry_at: float = 0.0  # a failed engine is started again no sooner (by the plan's Replace)
    started_at: float = 0.0
    ready_at: float | None = None
    health_failures: int = 0  # consecutive failed health probes of a ready engine
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    intent: Intent | None = None  # why it was asked to end: its exit is then expected
    pending: EngineAssignment | None = None  # what to start once it has ended (intent "restart")
    kill_reason: str | None = None  # why it was killed for misbehaving: reported as last_exit
    escalate_at: float | None = None  # when an ending that takes too long gets the next signal
    sigterm_sent: bool = False  # the next escalation is SIGKILL


@dataclass(frozen=True)
class SlotPolicy:
    """The timeouts and backoff the transitions apply (AgentSettings' fields of the same names)."""

    startup_timeout_s: float = 600.0  # a starting engine not healthy after this long is killed
    unhealthy_after: int = 10  # consecutive failed probes of a ready engine before it is killed
    stop_timeout_s: float = 40.0  # SIGTERM to SIGKILL
    drain_timeout_s: float = 60.0  # a draining engine still up after this long gets SIGTERM
    stable_after_s: float = 60.0  # ready this long and a crash no longer counts toward the backoff
    restart_backoff: Backoff = RESTART_BACKOFF
    uniform: Uniform = random.uniform  # the backoff's jitter source, injected so tests can pin it


def adopted(assignment: EngineAssignment, pid: int, ports: PortBlock, restarts: int, now: float) -> Slot:
    """A process a previous agent left running: probed again from `starting`."""
    return Slot(assignment=assignment, state="starting", pid=pid, ports=ports, restarts=restarts, started_at=now)


def is_forgettable(slot: Slot) -> bool:
    """Stopped for good: once it is no longer wanted, it disappears from the report."""
    return slot.state == "stopped" and slot.pid is None and not slot.launching


# --- events: what happened to the slot ---


@dataclass(frozen=True)
class Start:
    """The plan: run `assignment` (the engine is absent or stopped)."""

    assignment: EngineAssignment


@dataclass(frozen=True)
class Replace:
    """The plan: run `assignment` instead (another class or role, or the engine failed); waits out the
    crash backoff when no process runs."""

    assignment: EngineAssignment


@dataclass(frozen=True)
class Unassign:
    """The plan: the engine is no longer wanted here."""


@dataclass(frozen=True)
class Drain:
    """The plan: stop taking requests, finish in-flight ones, exit."""


@dataclass(frozen=True)
class DrainAnswered:
    """The engine's answer to POST /drain: `ok` when it accepted."""

    ok: bool


@dataclass(frozen=True)
class OperatorRestart:
    """Break-glass restart: end the process and start the same assignment; no backoff wait."""


@dataclass(frozen=True)
class StopNow:
    """Break-glass stop, or the agent shutting down: SIGTERM now (the engine drains within its grace)."""


@dataclass(frozen=True)
class Abandon:
    """The agent exits and gives up waiting: SIGKILL whatever still runs and drop its record."""


@dataclass(frozen=True)
class Spawned:
    """The answer to Spawn: the process runs."""

    pid: int
    ports: PortBlock


@dataclass(frozen=True)
class SpawnFailed:
    """The answer to Spawn: no process (`ports` None when no port block was free)."""

    reason: str
    ports: PortBlock | None


@dataclass(frozen=True)
class Exited:
    """The process ended; `how` as agent.process.describe_exit says it ('exit 1', 'signal SIGKILL')."""

    how: str


@dataclass(frozen=True)
class HealthChecked:
    """A GET /health of a starting or ready engine answered (`healthy`: 200) or failed."""

    healthy: bool


@dataclass(frozen=True)
class MetricsScraped:
    """A /metrics scrape succeeded."""

    metrics: EngineMetrics


@dataclass(frozen=True)
class Tick:
    """Time passed: act on a deadline that is due (a drain or a SIGTERM that takes too long)."""


Event = (Start | Replace | Unassign | Drain | DrainAnswered | OperatorRestart | StopNow | Abandon | Spawned
         | SpawnFailed | Exited | HealthChecked | MetricsScraped | Tick)


# --- effects: what the supervisor does for the slot ---


@dataclass(frozen=True)
class Spawn:
    """Pick ports (preferring `Slot.ports`), launch `assignment`, write its record; answer Spawned/SpawnFailed."""

    assignment: EngineAssignment


@dataclass(frozen=True)
class Signal:
    """Send `sig` to the engine's process group (nothing when it has already gone)."""

    sig: signal.Signals


@dataclass(frozen=True)
class RequestDrain:
    """POST /drain to the engine; answer DrainAnswered."""


@dataclass(frozen=True)
class Scrape:
    """GET /metrics of the engine; answer MetricsScraped when it worked."""


@dataclass(frozen=True)
class RemoveRecord:
    """Drop the engine's re-adoption record: no process of this slot runs any more."""


@dataclass(frozen=True)
class Report:
    """A line for the agent's log."""

    level: int
    message: str


Effect = Spawn | Signal | RequestDrain | Scrape | RemoveRecord | Report
Step = tuple[Slot, list[Effect]]


def transition(slot: Slot, event: Event, now: float, policy: SlotPolicy) -> Step:
    """The slot after `event` at `now`, and what to do about it. An event that does not apply to the slot's
    state (a probe answer for an engine already ending, a start while one is running) changes nothing."""
    match event:
        case Start(assignment):
            return _launch(slot, assignment, restart=False) if _idle(slot) else (slot, [])
        case Replace(assignment):
            return _replace(slot, assignment, now, policy)
        case Unassign():
            return _unassign(slot, now, policy)
        case Drain():
            return _drain(slot, now, policy)
        case DrainAnswered(ok):
            return _drain_answered(slot, ok, now, policy)
        case OperatorRestart():
            return _operator_restart(slot, now, policy)
        case StopNow():
            return _terminate(slot, "stop", now, policy) if slot.pid is not None else (slot, [])
        case Abandon():
            return _abandon(slot)
        case Spawned(pid, ports):
            return _spawned(slot, pid, ports, now) if slot.launching else (slot, [])
        case SpawnFailed(reason, ports):
            return _spawn_failed(slot, reason, ports, now, policy) if slot.launching else (slot, [])
        case Exited(how):
            return _exited(slot, how, now, policy) if slot.pid is not None else (slot, [])
        case HealthChecked(healthy):
            return _health_checked(slot, healthy, now, policy)
        case MetricsScraped(metrics):
            return (replace(slot, metrics=metrics), []) if slot.pid is not None else (slot, [])
        case Tick():
            return _escalate(slot, now, policy)
    raise TypeError(f"not a slot event: {event!r}")


def _idle(slot: Slot) -> bool:
    """No process runs and none is being started: a Spawn now cannot make a second one."""
    return slot.pid is None and not slot.launching


def _name(slot: Slot) -> str:
    return slot.assignment.name


# --- starting ---


def _launch(slot: Slot, assignment: EngineAssignment, *, restart: bool) -> Step:
    restarts = slot.restarts
    if restart:
        same = (assignment.class_ref, assignment.role) == (slot.assignment.class_ref, slot.assignment.role)
        restarts = restarts + 1 if same else 0
    return replace(slot, assignment=assignment, restarts=restarts, launching=True), [Spawn(assignment)]


def _spawned(slot: Slot, pid: int, ports: PortBlock, now: float) -> Step:
    a = slot.assignment
    started = replace(slot, state="starting", pid=pid, ports=ports, launching=False, started_at=now,
                      ready_at=None, health_failures=0)
    message = f"engine {a.name} ({a.class_ref}, {a.role}) started: pid {pid}, port {ports.http}"
    return started, [Report(logging.INFO, message)]


def _spawn_failed(slot: Slot, reason: str, ports: PortBlock | None, now: float, policy: SlotPolicy) -> Step:
    return _fail(replace(slot, launching=False, ports=ports), reason, now, policy)


def _replace(slot: Slot, assignment: EngineAssignment, now: float, policy: SlotPolicy) -> Step:
    if slot.pid is not None:
        return _terminate(slot, "restart", now, policy, pending=assignment)
    if _idle(slot) and now >= slot.retry_at:
        return _launch(slot, assignment, restart=True)
    return slot, []  # the crash backoff has not passed yet: the plan asks again next pass


def _operator_restart(slot: Slot, now: float, policy: SlotPolicy) -> Step:
    if slot.pid is not None:
        return _terminate(slot, "restart", now, policy, pending=slot.assignment)
    if slot.launching:
        return slot, []
    return _launch(slot, slot.assignment, restart=True)


# --- ending ---


def _terminate(slot: Slot, intent: Intent, now: float, policy: SlotPolicy,
               pending: EngineAssignment | None = None) -> Step:
    """SIGTERM: the engine drains in-flight requests within its grace, then exits; SIGKILL if it does not."""
    ending = replace(slot, intent=intent, pending=pending, state="draining", sigterm_sent=True,
                     escalate_at=now + policy.stop_timeout_s)
    return ending, [Signal(signal.SIGTERM)]


def _unassign(slot: Slot, now: float, policy: SlotPolicy) -> Step:
    if slot.pid is not None:
        return _terminate(slot, "stop", now, policy)
    return replace(slot, state="stopped"), []


def _drain(slot: Slot, now: float, policy: SlotPolicy) -> Step:
    """Reference engine: POST /drain (503 to new requests, in-flight ones finish, exit when idle).
    vLLM: SIGTERM, its graceful shutdown."""
    if slot.pid is None:
        return (slot, []) if slot.launching else (replace(slot, state="stopped"), [])
    if backend_of(slot.assignment) == "reference":
        return replace(slot, intent="drain", state="draining"), [RequestDrain()]
    return _terminate(slot, "drain", now, policy)


def _drain_answered(slot: Slot, ok: bool, now: float, policy: SlotPolicy) -> Step:
    if slot.pid is None or slot.intent != "drain":
        return slot, []  # it ended, or was stopped or restarted, while the request was out
    if ok:
        draining = replace(slot, escalate_at=now + policy.drain_timeout_s)
        return draining, [Report(logging.INFO, f"engine {_name(slot)} draining")]
    return _terminate(slot, "drain", now, policy)  # it did not answer: SIGTERM drains it too


def _kill(slot: Slot, reason: str) -> Step:
    killed = replace(slot, kill_reason=reason, escalate_at=None)
    return killed, [Report(logging.WARNING, f"killing engine {_name(slot)}: {reason}"), Signal(signal.SIGKILL)]


def _escalate(slot: Slot, now: float, policy: SlotPolicy) -> Step:
    if slot.pid is None or slot.escalate_at is None or now < slot.escalate_at:
        return slot, []
    if not slot.sigterm_sent:
        return replace(slot, sigterm_sent=True, escalate_at=now + policy.stop_timeout_s), [Signal(signal.SIGTERM)]
    return replace(slot, escalate_at=None), [Signal(signal.SIGKILL)]


def _abandon(slot: Slot) -> Step:
    if slot.pid is None:
        return slot, []
    return replace(slot, escalate_at=None), [Signal(signal.SIGKILL), RemoveRecord()]


def _exited(slot: Slot, how: str, now: float, policy: SlotPolicy) -> Step:
    """The process has gone: start the pending assignment, settle as stopped, or count a crash."""
    intent, pending, last_exit = slot.intent, slot.pending, slot.kill_reason or how
    gone = replace(slot, pid=None, last_exit=last_exit, metrics=EngineMetrics(), intent=None, pending=None,
                   kill_reason=None, escalate_at=None, sigterm_sent=False)
    if intent == "restart" and pending is not None:
        after, effects = _launch(gone, pending, restart=True)
    elif intent is not None:
        after, effects = replace(gone, state="stopped"), [Report(logging.INFO, f"engine {_name(slot)} stopped ({last_exit})")]
    else:
        after, effects = _fail(gone, last_exit, now, policy)
    return after, [RemoveRecord(), *effects]


def _fail(slot: Slot, reason: str, now: float, policy: SlotPolicy) -> Step:
    """Failed; the plan's Replace starts it again once the backoff has passed."""
    streak = slot.crash_streak
    if slot.ready_at is not None and now - slot.ready_at >= policy.stable_after_s:
        streak = 0  # it ran fine for a while: this crash starts a new streak
    delay = policy.restart_backoff.delay(streak, policy.uniform)
    failed = replace(slot, state="failed", last_exit=reason, ready_at=None, retry_at=now + delay,
                     crash_streak=streak + 1)
    return failed, [Report(logging.WARNING, f"engine {_name(slot)} failed ({reason}); restart in {delay:.1f}s")]


# --- probing ---


def _health_checked(slot: Slot, healthy: bool, now: float, policy: SlotPolicy) -> Step:
    if slot.pid is None or slot.state not in ("starting", "ready"):
        return slot, []  # it began to end while the probe was out: the answer is no longer about its state
    if slot.state == "starting":
        if healthy:
            ready = replace(slot, state="ready", ready_at=now, health_failures=0)
            port = slot.ports.http if slot.ports else None
            return ready, [Report(logging.INFO, f"engine {_name(slot)} ready on port {port}")]
        if now - slot.started_at > policy.startup_timeout_s:
            return _kill(slot, f"not healthy within {policy.startup_timeout_s:.0f}s")
        return slot, []
    failures = 0 if healthy else slot.health_failures + 1
    probed = replace(slot, health_failures=failures)
    if failures >= policy.unhealthy_after:
        return _kill(probed, f"unhealthy: {failures} failed health probes")
    return probed, [Scrape()]
