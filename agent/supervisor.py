"""The engine supervisor: makes the engines on this node match the desired assignment, pass after pass.

Each pass (`tick`) gathers a snapshot and acts on a pure decision:
  1. reap      - notice processes that ended (expected after a stop/drain, a crash otherwise);
  2. probe     - GET /health of each live engine (starting -> ready; a ready engine failing too often is
                 killed) and scrape its /metrics;
  3. plan, act - `agent.plan.plan_actions(desired, observed)`, then start / stop / restart / drain;
  4. escalate  - a drain past its deadline gets SIGTERM, a SIGTERM past its deadline gets SIGKILL.

Desired state is the controller's last assignment (`set_desired`) with the operator's break-glass holds on
top. Before the first assignment arrives (agent just started, controller unreachable) the desired state is
"what already runs", so re-adopted engines are kept and crash-restarted but nothing is started or stopped.

A crashed engine is restarted after a full-jitter backoff that grows with consecutive crashes (reset once an
engine has stayed ready for `stable_after_s`); `restarts` and `last_exit` say so in its observed state.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from agent import process as proc
from agent.launch import LaunchError, PortBlock, backend_of, port_layout, port_width, render_launch
from agent.metrics import parse_engine_metrics
from agent.plan import Action, plan_actions
from agent.ports import pick_port_block, port_is_free
from agent.settings import AgentSettings
from engine.contract import EngineAssignment, EngineMetrics, EngineObserved, EngineState

log = logging.getLogger("fleetctl.agent.supervisor")

Intent = Literal["stop", "drain", "restart"]
BreakGlass = Literal["drain", "restart", "stop"]
PROBE_TIMEOUT_S = 2.0
KEEPALIVE_EXPIRY_S = 4.0  # idle probe connections dropped before the engine's uvicorn closes them (5 s)


@dataclass
class EngineSlot:
    """Everything the supervisor knows about one engine name."""

    assignment: EngineAssignment
    log_path: Path
    state: EngineState = "stopped"
    process: proc.ManagedProcess | None = None
    ports: PortBlock | None = None
    restarts: int = 0
    last_exit: str | None = None
    crash_streak: int = 0  # consecutive crashes: the restart backoff's attempt number
    retry_at: float = 0.0  # a failed engine is restarted no sooner (monotonic seconds)
    started_at: float = 0.0
    ready_at: float | None = None
    health_failures: int = 0
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    intent: Intent | None = None  # why we asked it to end: its exit is then expected
    pending: EngineAssignment | None = None  # what to start once it has ended (restart)
    kill_reason: str | None = None  # set when we kill it for misbehaving: reported as last_exit
    escalate_at: float | None = None
    signals_sent: list[str] = field(default_factory=list)


class Supervisor:
    def __init__(self, settings: AgentSettings, *, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.clock = clock
        self.slots: dict[str, EngineSlot] = {}
        self.desired: list[EngineAssignment] | None = None  # None: no assignment received yet
        self.held: set[str] = set()  # break-glass drain/stop: kept stopped until a new generation
        self._http = httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))

    # --- desired and observed state ---

    def set_desired(self, assignment: list[EngineAssignment], *, new_generation: bool) -> None:
        self.desired = list(assignment)
        if new_generation:
            self.held.clear()  # the controller has spoken since the operator acted

    def effective_desired(self) -> list[EngineAssignment]:
        if self.desired is None:
            base = [slot.assignment for slot in self.slots.values()]
        else:
            base = self.desired
        return [a.model_copy(update={"drain": True}) if a.name in self.held else a for a in base]

    def observed(self) -> list[EngineObserved]:
        return [self._observe(slot) for slot in self.slots.values()]

    def _observe(self, slot: EngineSlot) -> EngineObserved:
        a, ports, host = slot.assignment, slot.ports, self.settings.url_host
        return EngineObserved(
            name=a.name, model=a.model, class_ref=a.class_ref, role=a.role, state=slot.state,
            pid=slot.process.pid if slot.process else None,
            port=ports.http if ports else None,
            url=f"http://{host}:{ports.http}" if ports else None,
            kv_events_endpoint=f"tcp://{host}:{ports.kv_events}" if ports else None,
            restarts=slot.restarts, last_exit=slot.last_exit, metrics=slot.metrics,
        )

    # --- one pass ---

    async def tick(self) -> None:
        now = self.clock()
        self._reap(now)
        await self._probe(now)
        desired = self.effective_desired()
        for action in plan_actions(desired, self.observed()):
            await self._apply(action, now)
        self._escalate(now)
        self._forget_stopped({a.name for a in desired})

    async def run(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        """Tick every `tick_s`, or at once when `wake` is set (a new assignment, a break-glass action)."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:  # a bug in one pass must not stop supervision of every engine
                log.exception("supervisor pass failed")
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), timeout=self.settings.tick_s)
            except asyncio.TimeoutError:
                pass

    def _reap(self, now: float) -> None:
        for slot in list(self.slots.values()):
            if slot.process is not None and (how := slot.process.poll()) is not None:
                self._on_exit(slot, how, now)

    def _on_exit(self, slot: EngineSlot, how: str, now: float) -> None:
        name = slot.assignment.name
        proc.remove_record(self.settings.records_dir, name)
        intent, pending = slot.intent, slot.pending
        slot.last_exit = slot.kill_reason or how
        slot.process, slot.metrics, slot.intent, slot.pending, slot.kill_reason = None, EngineMetrics(), None, None, None
        slot.escalate_at, slot.signals_sent = None, []
        if intent == "restart" and pending is not None:
            self._spawn(slot, pending, now, restart=True)
        elif intent in ("stop", "drain", "restart"):
            slot.state = "stopped"
            log.info("engine %s stopped (%s)", name, slot.last_exit)
        else:
            self._fail(slot, slot.last_exit, now)

    def _fail(self, slot: EngineSlot, reason: str, now: float) -> None:
        """Mark the engine failed; the plan restarts it once the backoff has passed."""
        if slot.ready_at is not None and now - slot.ready_at >= self.settings.stable_after_s:
            slot.crash_streak = 0
        slot.state, slot.last_exit, slot.ready_at = "failed", reason, None
        delay = self.settings.restart_backoff.delay(slot.crash_streak)
        slot.retry_at = now + delay
        slot.crash_streak += 1
        log.warning("engine %s failed (%s); restart in %.1fs", slot.assignment.name, reason, delay)

    async def _probe(self, now: float) -> None:
        live = [s for s in self.slots.values() if s.process is not None and s.state in ("starting", "ready")]
        await asyncio.gather(*(self._probe_one(slot, now) for slot in live))

    async def _probe_one(self, slot: EngineSlot, now: float) -> None:
        url, state = self._observe(slot).url, slot.state
        healthy = await self._get_ok(f"{url}/health")
        if slot.state != state or slot.process is None:
            return  # a break-glass call acted on it while we waited: its state is no longer ours to set
        if slot.state == "starting":
            if healthy:
                slot.state, slot.ready_at, slot.health_failures = "ready", now, 0
                log.info("engine %s ready at %s", slot.assignment.name, url)
            elif now - slot.started_at > self.settings.startup_timeout_s:
                self._kill(slot, f"not healthy within {self.settings.startup_timeout_s:.0f}s")
            return
        slot.health_failures = 0 if healthy else slot.health_failures + 1
        if slot.health_failures >= self.settings.unhealthy_after:
            self._kill(slot, f"unhealthy: {slot.health_failures} failed health probes")
            return
        slot.metrics = await self._scrape(f"{url}/metrics") or slot.metrics

    async def _get_ok(self, url: str) -> bool:
        try:
            return (await self._http.get(url)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _scrape(self, url: str) -> EngineMetrics | None:
        try:
            response = await self._http.get(url)
            response.raise_for_status()
            return parse_engine_metrics(response.text)
        except (httpx.HTTPError, ValueError):
            return None

    # --- actions ---

    async def _apply(self, action: Action, now: float) -> None:
        slot = self.slots.get(action.name)
        if action.kind == "start":
            assert action.assignment is not None
            self._spawn(self._slot_for(action.assignment), action.assignment, now, restart=False)
        elif action.kind == "restart" and slot is not None:
            assert action.assignment is not None
            if slot.process is not None:
                self._terminate(slot, now, "restart", pending=action.assignment)
            elif now >= slot.retry_at:
                self._spawn(slot, action.assignment, now, restart=True)
        elif action.kind == "stop" and slot is not None:
            if slot.process is not None:
                self._terminate(slot, now, "stop")
            else:
                slot.state = "stopped"
        elif action.kind == "drain" and slot is not None:
            await self._drain(slot, now)

    def _slot_for(self, assignment: EngineAssignment) -> EngineSlot:
        if assignment.name not in self.slots:
            log_path = self.settings.log_dir / f"{assignment.name}.log"
            self.slots[assignment.name] = EngineSlot(assignment=assignment, log_path=log_path)
        return self.slots[assignment.name]

    def _spawn(self, slot: EngineSlot, assignment: EngineAssignment, now: float, *, restart: bool) -> None:
        if restart:
            same = (assignment.class_ref, assignment.role) == (slot.assignment.class_ref, slot.assignment.role)
            slot.restarts = slot.restarts + 1 if same else 0
        slot.assignment = assignment
        slot.ports = self._pick_ports(slot)
        if slot.ports is None:
            self._fail(slot, f"no {port_width(assignment)} free consecutive ports in {self.settings.port_range}", now)
            return
        try:
            launch = render_launch(
                assignment, slot.ports, hash_seed=self.settings.hash_seed, host=self.settings.host,
                python=self.settings.python, vllm_executable=self.settings.vllm_executable,
            )
            slot.process = proc.spawn(launch.argv, launch.env, slot.log_path)
        except (LaunchError, OSError) as exc:
            self._fail(slot, f"launch failed: {exc}", now)
            return
        slot.state, slot.started_at, slot.ready_at, slot.health_failures = "starting", now, None, 0
        record = proc.ProcessRecord(
            name=assignment.name, pid=slot.process.pid, create_time=slot.process.create_time,
            port=slot.ports.http, assignment=assignment.model_dump(mode="json"), log_path=str(slot.log_path),
            restarts=slot.restarts,
        )
        proc.write_record(self.settings.records_dir, record)
        log.info("engine %s (%s, %s) started: pid %d, port %d", assignment.name, assignment.class_ref,
                 assignment.role, slot.process.pid, slot.ports.http)

    def _pick_ports(self, slot: EngineSlot) -> PortBlock | None:
        reserved = {p for other in self.slots.values() if other is not slot and other.ports
                    and other.process is not None for p in other.ports.ports}
        prefer = slot.ports.http if slot.ports else None
        start = pick_port_block(self.settings.port_range, port_width(slot.assignment), reserved, port_is_free, prefer)
        return None if start is None else port_layout(start, slot.assignment)

    def _terminate(self, slot: EngineSlot, now: float, intent: Intent, pending: EngineAssignment | None = None) -> None:
        """SIGTERM (the engine drains in-flight requests within its grace, then exits); SIGKILL later."""
        slot.intent, slot.pending, slot.state = intent, pending, "draining"
        self._signal(slot, signal.SIGTERM, now + self.settings.stop_timeout_s)

    async def _drain(self, slot: EngineSlot, now: float) -> None:
        """Reference engine: POST /drain (503 to new requests, in-flight ones finish, exit when idle).
        vLLM, or a reference engine that does not answer: SIGTERM, vLLM's graceful shutdown."""
        slot.intent, slot.state = "drain", "draining"
        if backend_of(slot.assignment) == "reference" and await self._post_ok(f"{self._observe(slot).url}/drain"):
            slot.escalate_at = now + self.settings.drain_timeout_s
            log.info("engine %s draining", slot.assignment.name)
            return
        self._signal(slot, signal.SIGTERM, now + self.settings.stop_timeout_s)

    async def _post_ok(self, url: str) -> bool:
        try:
            return (await self._http.post(url)).is_success
        except httpx.HTTPError:
            return False

    def _kill(self, slot: EngineSlot, reason: str) -> None:
        log.warning("killing engine %s: %s", slot.assignment.name, reason)
        slot.kill_reason = reason
        self._signal(slot, signal.SIGKILL, None)

    def _signal(self, slot: EngineSlot, sig: signal.Signals, escalate_at: float | None) -> None:
        if slot.process is not None:
            slot.process.send(sig)
            slot.signals_sent.append(sig.name)
        slot.escalate_at = escalate_at

    def _escalate(self, now: float) -> None:
        for slot in self.slots.values():
            if slot.process is None or slot.escalate_at is None or now < slot.escalate_at:
                continue
            if "SIGTERM" not in slot.signals_sent:
                self._signal(slot, signal.SIGTERM, now + self.settings.stop_timeout_s)
            else:
                self._signal(slot, signal.SIGKILL, None)

    def _forget_stopped(self, desired: set[str]) -> None:
        """An engine that has stopped and is no longer wanted disappears from the report."""
        for name in [n for n, s in self.slots.items() if s.state == "stopped" and s.process is None and n not in desired]:
            del self.slots[name]

    # --- break-glass: the operator acts without the controller ---

    def break_glass(self, name: str, action: BreakGlass) -> None:
        """drain / stop hold the engine stopped until the controller sends a new generation; restart starts
        it again (and lifts a hold). Raises KeyError for an engine this agent does not run."""
        slot = self.slots[name]
        now = self.clock()
        log.warning("break-glass %s of engine %s", action, name)
        if action == "restart":
            self.held.discard(name)
            if slot.process is not None:
                self._terminate(slot, now, "restart", pending=slot.assignment)
            else:
                self._spawn(slot, slot.assignment, now, restart=True)
            return
        self.held.add(name)
        if action == "stop" and slot.process is not None:
            self._terminate(slot, now, "stop")
        # drain: the next pass drains it, as for a controller-sent drain

    # --- start-up and shut-down ---

    def adopt_running(self) -> list[str]:
        """Take over engines a previous agent on this node left running (per the record files)."""
        adopted = []
        for record in proc.read_records(self.settings.records_dir):
            process = proc.adopt(record)
            if process is None:
                proc.remove_record(self.settings.records_dir, record.name)
                continue
            assignment = EngineAssignment(**record.assignment)
            self.slots[record.name] = EngineSlot(
                assignment=assignment, log_path=Path(record.log_path), state="starting", process=process,
                ports=port_layout(record.port, assignment), restarts=record.restarts, started_at=self.clock(),
            )
            adopted.append(record.name)
        return adopted

    async def shutdown(self, *, stop_engines: bool) -> None:
        """Stop every engine (SIGTERM, then SIGKILL after stop_timeout_s), or leave them to be re-adopted."""
        if stop_engines:
            live = [s for s in self.slots.values() if s.process is not None]
            for slot in live:
                self._terminate(slot, self.clock(), "stop")
            deadline = self.clock() + self.settings.stop_timeout_s
            while any(s.process is not None for s in live) and self.clock() < deadline:
                self._reap(self.clock())
                await asyncio.sleep(0.1)
            for slot in live:
                if slot.process is not None:
                    slot.process.send(signal.SIGKILL)
                    proc.remove_record(self.settings.records_dir, slot.assignment.name)
        await self._http.aclose()
