"""The engine supervisor: makes the engines on this node match the desired assignment, pass after pass.

The decisions about one engine are `agent.engine_slot.transition`, a pure state machine; this module is the
part that touches the world. It turns what it sees into slot events, stores each slot's new state and carries
out the effects (spawn, signal, POST /drain, scrape /metrics, drop a record, log). Each pass (`tick`):
  1. reap      - a process that ended becomes `Exited` (expected after a stop/drain, a crash otherwise);
  2. probe     - GET /health of each starting or ready engine becomes `HealthChecked`;
  3. plan, act - `agent.plan.plan_actions(desired, observed)`: each action becomes Start / Replace / Unassign
                 / Drain;
  4. escalate  - `Tick`: a drain past its deadline gets SIGTERM, a SIGTERM past its deadline gets SIGKILL.

Desired state is the controller's last assignment (`set_desired`) with the operator's break-glass holds on
top. Before the first assignment arrives (agent just started, controller unreachable) the desired state is
"what already runs", so re-adopted engines are kept and crash-restarted but nothing is started or stopped.

Each engine's report also says what its process runs: the command line and environment it was launched
with, and once it is ready, the engine's own account of its settings (agent.engine_config), for the
controller's drift check. A canary drill's planted fault (EngineAssignment.planted_fault) is the one
exception: the engine is started with it in its environment, and the report leaves it out; a change of
planted fault restarts the engine (drain, then start), as a change of class does.

A crashed engine is restarted after a full-jitter backoff that grows with consecutive crashes (reset once an
engine has stayed ready for `stable_after_s`); `restarts` and `last_exit` say so in its observed state.

Invariant: a slot's `process` handle is set exactly when its state has a `pid` (the handle is stored when a
spawn succeeds, dropped when its exit is fed to the state machine).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from agent import engine_slot as es
from agent import process as proc
from agent.engine_config import fetch_reported, launched_command
from agent.kv_tiers.registry import TierRegistry
from agent.launch import (LaunchError, PortBlock, backend_of, class_name_of, planted_fault_env, port_layout,
                          port_width, render_launch, wants_kv_tiers)
from agent.plan import Action, plan_actions
from agent.ports import pick_port_block, port_is_free
from agent.settings import AgentSettings
from engine.contract import EngineAssignment, EngineMetrics, EngineObserved, LaunchedCommand, ReportedConfig
from engine.contract.faults import FAULT_ENV
from engine.contract.kv_tier import TIER_TOKEN_ENV
from engine.contract.scrape import parse_engine_metrics

log = logging.getLogger("fleetctl.agent.supervisor")

BreakGlass = Literal["drain", "restart", "stop"]
PROBE_TIMEOUT_S = 2.0
KEEPALIVE_EXPIRY_S = 4.0  # idle probe connections dropped before the engine's uvicorn closes them (5 s)
CONFIG_ASKS = 5  # times a ready engine is asked for its config before the agent stops asking


@dataclass
class EngineSlot:
    """One engine name: its state machine's state, and what cannot be plain data (its process, its log)."""

    state: es.Slot
    log_path: Path
    process: proc.ManagedProcess | None = None
    launched: LaunchedCommand | None = None  # the command line and env of the running process
    reported: ReportedConfig | None = None  # what the running process said it runs, once ready
    config_asks: int = 0  # times the running process was asked for its config

    @property
    def name(self) -> str:
        return self.state.assignment.name


def slot_policy(settings: AgentSettings) -> es.SlotPolicy:
    return es.SlotPolicy(
        startup_timeout_s=settings.startup_timeout_s, unhealthy_after=settings.unhealthy_after,
        stop_timeout_s=settings.stop_timeout_s, drain_timeout_s=settings.drain_timeout_s,
        stable_after_s=settings.stable_after_s, restart_backoff=settings.restart_backoff,
    )


class Supervisor:
    def __init__(self, settings: AgentSettings, *, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.clock = clock
        self.policy = slot_policy(settings)
        self.slots: dict[str, EngineSlot] = {}
        self.desired: list[EngineAssignment] | None = None  # None: no assignment received yet
        # break-glass drain/stop -> the direct-action journal's seq: kept stopped, whatever the controller
        # sends, until the operator resolves it (adopt or revert, `fleetctl breakglass reconcile`) or restarts it
        self.held: dict[str, int] = {}
        self.tiers = TierRegistry(settings.kv_tier_dir)  # the KV tiers of classes that ask for them
        self._http = httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))

    # --- desired and observed state ---

    def set_desired(self, assignment: list[EngineAssignment]) -> None:
        self.desired = list(assignment)

    def effective_desired(self) -> list[EngineAssignment]:
        if self.desired is None:
            base = [slot.state.assignment for slot in self.slots.values()]
        else:
            base = self.desired
        return [a.model_copy(update={"drain": True}) if a.name in self.held else a for a in base]

    def observed(self) -> list[EngineObserved]:
        return [self._observe(slot) for slot in self.slots.values()]

    def _observe(self, slot: EngineSlot) -> EngineObserved:
        s = slot.state
        a, ports = s.assignment, s.ports
        running = s.pid is not None  # what a process runs is reported only while it runs
        return EngineObserved(
            name=a.name, model=a.model, class_ref=a.class_ref, role=a.role, state=s.state, pid=s.pid,
            port=ports.http if ports else None, url=self._url(s),
            kv_events_endpoint=f"tcp://{self.settings.url_host}:{ports.kv_events}" if ports else None,
            restarts=s.restarts, last_exit=s.last_exit, metrics=s.metrics,
            launched=slot.launched if running else None, reported=slot.reported if running else None,
        )

    def running_faults(self) -> dict[str, str | None]:
        """engine name -> the planted fault its process runs with, or is being started with (never reported)."""
        return {name: slot.state.assignment.planted_fault for name, slot in self.slots.items()}

    def _url(self, s: es.Slot) -> str | None:
        return f"http://{self.settings.url_host}:{s.ports.http}" if s.ports else None

    # --- one pass ---

    async def tick(self) -> None:
        now = self.clock()
        self._reap(now)
        await self._probe(now)
        desired = self.effective_desired()
        for action in plan_actions(desired, self.observed(), self.running_faults()):
            await self._act(action, now)
        for slot in list(self.slots.values()):
            self._apply_local(slot, es.Tick(), now)
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
                slot.process = None
                self._apply_local(slot, es.Exited(how), now)

    async def _probe(self, now: float) -> None:
        live = [s for s in self.slots.values() if s.process is not None and s.state.state in ("starting", "ready")]
        await asyncio.gather(*(self._probe_one(slot, now) for slot in live))

    async def _probe_one(self, slot: EngineSlot, now: float) -> None:
        healthy = await self._get_ok(f"{self._url(slot.state)}/health")
        await self._apply(slot, es.HealthChecked(healthy), now)
        if slot.state.state == "ready" and slot.reported is None and slot.config_asks < CONFIG_ASKS:
            await self._ask_config(slot)

    async def _ask_config(self, slot: EngineSlot) -> None:
        """Once ready, the engine is asked what it runs (agent.engine_config); a few tries, then no more."""
        slot.config_asks += 1
        pid = slot.state.pid
        reported = await fetch_reported(self._http, self._url(slot.state) or "", backend_of(slot.state.assignment))
        if slot.state.pid == pid:  # still the process that was asked
            slot.reported = reported

    async def _act(self, action: Action, now: float) -> None:
        if action.kind == "start":
            assert action.assignment is not None
            await self._apply(self._slot_for(action.assignment), es.Start(action.assignment), now)
            return
        slot = self.slots.get(action.name)
        if slot is None:
            return
        if action.kind == "restart":
            assert action.assignment is not None
            await self._apply(slot, es.Replace(action.assignment), now)
        elif action.kind == "stop":
            await self._apply(slot, es.Unassign(), now)
        elif action.kind == "drain":
            await self._apply(slot, es.Drain(), now)

    def _slot_for(self, assignment: EngineAssignment) -> EngineSlot:
        if assignment.name not in self.slots:
            log_path = self.settings.log_dir / f"{assignment.name}.log"
            self.slots[assignment.name] = EngineSlot(state=es.Slot(assignment=assignment), log_path=log_path)
        return self.slots[assignment.name]

    def _forget_stopped(self, desired: set[str]) -> None:
        """An engine that has stopped and is no longer wanted disappears from the report."""
        for name in [n for n, s in self.slots.items() if es.is_forgettable(s.state) and n not in desired]:
            del self.slots[name]

    # --- applying events and their effects ---

    async def _apply(self, slot: EngineSlot, event: es.Event, now: float) -> None:
        """Feed `event`, carry out its effects, and feed back the answers of those that went to the engine."""
        for effect in self._step(slot, event, now):
            answer = await self._ask_engine(slot, effect)
            if answer is not None:
                await self._apply(slot, answer, now)

    def _apply_local(self, slot: EngineSlot, event: es.Event, now: float) -> None:
        """`_apply` for events whose effects never wait on the network (all but Drain and HealthChecked)."""
        left = self._step(slot, event, now)
        assert not left, f"{event!r} asked for network I/O in a synchronous context: {left!r}"

    def _step(self, slot: EngineSlot, event: es.Event, now: float) -> list[es.Effect]:
        """Transition, carry out the local effects; return the effects that wait on the engine's answer."""
        slot.state, effects = es.transition(slot.state, event, now, self.policy)
        remote: list[es.Effect] = []
        for effect in effects:
            match effect:
                case es.Spawn(assignment):
                    remote += self._step(slot, self._spawn(slot, assignment), now)
                case es.Signal(sig):
                    if slot.process is not None:
                        slot.process.send(sig)
                case es.RemoveRecord():
                    proc.remove_record(self.settings.records_dir, slot.name)
                case es.Report(level, message):
                    log.log(level, message)
                case es.RequestDrain() | es.Scrape():
                    remote.append(effect)
        return remote

    async def _ask_engine(self, slot: EngineSlot, effect: es.Effect) -> es.Event | None:
        url = self._url(slot.state)
        if isinstance(effect, es.RequestDrain):
            return es.DrainAnswered(await self._post_ok(f"{url}/drain"))
        if isinstance(effect, es.Scrape) and (metrics := await self._scrape(f"{url}/metrics")) is not None:
            return es.MetricsScraped(metrics)
        return None

    def _spawn(self, slot: EngineSlot, assignment: EngineAssignment) -> es.Spawned | es.SpawnFailed:
        """Ports, command line, process, record: the answer to a Spawn effect."""
        ports = self._pick_ports(slot, assignment)
        if ports is None:
            width, port_range = port_width(assignment), self.settings.port_range
            return es.SpawnFailed(f"no {width} free consecutive ports in {port_range}", None)
        try:
            tier_url = self._tier_url(assignment)
            launch = render_launch(
                assignment, ports, hash_seed=self.settings.hash_seed, host=self.settings.host,
                python=self.settings.python, vllm_executable=self.settings.vllm_executable, kv_tier_url=tier_url,
                kv_tier_dir=str(self.settings.kv_tier_dir), kv_tier_disk_enabled=self.tiers.disk_enabled,
            )
            # a planted fault comes from the assignment only, never from the agent's own environment; the tier
            # credential is not reported either (the heartbeat carries the launch's env)
            secret_env = {TIER_TOKEN_ENV: self.settings.kv_tier_token} if tier_url else {}
            process = proc.spawn(launch.argv, {**launch.env, **planted_fault_env(assignment), **secret_env},
                                 slot.log_path, without=(FAULT_ENV, TIER_TOKEN_ENV))
        except (LaunchError, OSError) as exc:
            return es.SpawnFailed(f"launch failed: {exc}", ports)
        slot.process = process
        # what is reported leaves the planted fault out: a drill's engine must look clean (engine.contract.faults)
        slot.launched = launched_command(launch.argv, proc.agent_set_env(launch.env))
        slot.reported, slot.config_asks = None, 0
        record = proc.ProcessRecord(
            name=assignment.name, pid=process.pid, create_time=process.create_time, port=ports.http,
            assignment=assignment.model_dump(mode="json"), log_path=str(slot.log_path), restarts=slot.state.restarts,
            launched=slot.launched.model_dump(mode="json"),
        )
        proc.write_record(self.settings.records_dir, record)
        return es.Spawned(process.pid, ports)

    def _tier_url(self, assignment: EngineAssignment) -> str | None:
        """The class's tier on this node (made now if it is the first engine of its class), for a reference
        engine whose class asks for tiers."""
        if backend_of(assignment) != "reference" or not wants_kv_tiers(assignment):
            return None
        name = class_name_of(assignment)
        self.tiers.ensure(name, assignment.spec.get("kv_tiers"))
        return f"{self.settings.local_api_url}/kv/tiers/{name}"

    def _pick_ports(self, slot: EngineSlot, assignment: EngineAssignment) -> PortBlock | None:
        reserved = {p for other in self.slots.values() if other is not slot and other.state.ports
                    and other.process is not None for p in other.state.ports.ports}
        prefer = slot.state.ports.http if slot.state.ports else None
        start = pick_port_block(self.settings.port_range, port_width(assignment), reserved, port_is_free, prefer)
        return None if start is None else port_layout(start, assignment)

    async def _get_ok(self, url: str) -> bool:
        try:
            return (await self._http.get(url)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _post_ok(self, url: str) -> bool:
        try:
            return (await self._http.post(url)).is_success
        except httpx.HTTPError:
            return False

    async def _scrape(self, url: str) -> EngineMetrics | None:
        try:
            response = await self._http.get(url)
            response.raise_for_status()
            return parse_engine_metrics(response.text)
        except (httpx.HTTPError, ValueError):
            return None

    # --- break-glass: the operator acts without the controller ---

    def break_glass(self, name: str, action: BreakGlass, seq: int = 0) -> None:
        """drain / stop hold the engine stopped (the hold is journal entry `seq`) until released; restart
        starts it again (and lifts a hold). Raises KeyError for an engine this agent does not run."""
        slot = self.slots[name]
        log.warning("break-glass %s of engine %s", action, name)
        if action == "restart":
            self.held.pop(name, None)
            self._apply_local(slot, es.OperatorRestart(), self.clock())
            return
        self.held[name] = seq
        if action == "stop":
            self._apply_local(slot, es.StopNow(), self.clock())
        # drain: the next pass drains it, as for a controller-sent drain

    def release_hold(self, seq: int, *, restart: bool) -> str | None:
        """Lift the hold that journal entry `seq` put on (restarting the engine when `restart`: the operator
        reverted the direct action). The engine's name, or None when no hold has that seq."""
        name = next((n for n, s in self.held.items() if s == seq), None)
        if name is None:
            return None
        del self.held[name]
        slot = self.slots.get(name)
        if restart and slot is not None:
            self._apply_local(slot, es.OperatorRestart(), self.clock())
        return name

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
            ports = port_layout(record.port, assignment)
            state = es.adopted(assignment, process.pid, ports, record.restarts, self.clock())
            self.slots[record.name] = EngineSlot(state=state, log_path=Path(record.log_path), process=process,
                                                 launched=_adopted_launch(record))
            adopted.append(record.name)
        return adopted

    async def shutdown(self, *, stop_engines: bool) -> None:
        """Stop every engine (SIGTERM, then SIGKILL after stop_timeout_s), or leave them to be re-adopted."""
        if stop_engines:
            live = [s for s in self.slots.values() if s.process is not None]
            for slot in live:
                self._apply_local(slot, es.StopNow(), self.clock())
            deadline = self.clock() + self.settings.stop_timeout_s
            while any(s.process is not None for s in live) and self.clock() < deadline:
                self._reap(self.clock())
                await asyncio.sleep(0.1)
            for slot in live:
                self._apply_local(slot, es.Abandon(), self.clock())
        await self._http.aclose()


def _adopted_launch(record: proc.ProcessRecord) -> LaunchedCommand:
    """What an adopted engine was launched with: as recorded by the agent that launched it; for a process
    recorded without it (an older agent, or an engine started by hand and recorded for adoption), its command
    line as the operating system shows it, and no environment (which variables were set for it is unknown)."""
    if record.launched is not None:
        try:
            return LaunchedCommand.model_validate(record.launched)
        except ValueError:
            pass
    return launched_command(proc.command_line(record.pid), {})
