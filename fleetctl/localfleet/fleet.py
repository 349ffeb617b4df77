"""A whole fleet on this machine, in one command: `up` starts a controller on SQLite, N agents and a default
deployment, then waits for the engines; `down` stops all of it. Everything listens on loopback.

    STATE_DIR/
      fleet.json          where everything is: URLs, PIDs (with creation times), log files
      fleet.db            the controller's SQLite store
      bootstrap-token     the controller's admin token (0600); the local agents use it too
      logs/               controller.log, agent-NODE.log, gateway.log
      agents/NODE/        each agent's state: logs/ENGINE.log, engines/ENGINE.json, admin-token (its
                          break-glass credential), direct/ (its direct-action journal)
      gateway/            the gateway's breakglass_token, direct-action journal and local flag overrides
      inventory.yaml      the agents and the gateway with their credential files (fleetctl --direct all ...)

Processes are started in their own sessions and stopped in order (agents first, which drain their engines;
then the controller). `down` works from fleet.json alone, so it stops a fleet started by another shell, and it
sweeps engines whose agent died before it could stop them (from the agents' engine records).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from agent.client import AgentApiError, AgentClient
from agent.ports import free_port, port_is_free
from agent.process import read_records
from engine.hashing import HASH_SEED_ENV, LEGACY_HASH_SEED, default_seed
from fleetctl.client import ControllerClient
from fleetctl.controller.paths import bootstrap_token_path, sqlite_url
from fleetctl.errors import FleetError
from fleetctl.inventory import AGENT_CREDENTIAL_FILE, GATEWAY_CREDENTIAL_FILE, INVENTORY_FILE, write_inventory
from fleetctl.localfleet import processes
from fleetctl.localfleet.processes import ProcessInfo, fleetctl_argv

FLEET_FILE = "fleet.json"
HASH_SEED_FILE = "hash_seed"  # the seed the state dir's fleet hashes prefixes with, fixed at its first start
HOST = "127.0.0.1"
DEPLOYMENT = "local"
GATEWAY_NAME = "local-gateway"
SERVED_NAMES = {"smollm2": "smollm2-135m", "tiny": "tiny"}
PORTS_PER_NODE = 100  # node i's engines take ports from engine_port_base + i * 100

Progress = Callable[[str], None]


class LocalFleetError(FleetError):
    """The local fleet could not be started or stopped; the message says where to look."""

    code = "local_fleet"


@dataclass(frozen=True)
class UpOptions:
    state_dir: Path
    nodes: int = 2
    model: str = "smollm2"  # smollm2 | tiny: the reference engine's weights
    controller_port: int = 8080  # 0: any free port
    engine_port_base: int = 8100
    gateway_port: int = 8000  # 0: any free port
    heartbeat_interval_s: float = 2.0
    kv_cache_mib: int = 64
    gateway_table_refresh_s: float | None = None  # None: the gateway's default
    ready_timeout_s: float = 900.0  # a fresh machine loads and dequantises SmolLM2 on first use


@dataclass
class FleetRecord:
    """fleet.json: what `down`, `status` and the demo need to find the fleet."""

    state_dir: str
    controller_url: str
    token_file: str
    log_dir: str
    model: str  # the reference engine's weights: smollm2 | tiny
    served_model: str  # the name clients ask for
    class_ref: str | None = None  # the default deployment's class revision
    processes: list[ProcessInfo] = field(default_factory=list)
    engines: list[dict[str, Any]] = field(default_factory=list)  # name, node, url, state
    gateway_url: str | None = None  # set once `up` starts a gateway
    hash_seed: str | None = None  # the prefix-hash seed every process of the fleet was given

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "processes": [p.to_json() for p in self.processes]}

    def save(self) -> None:
        path = Path(self.state_dir) / FLEET_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, state_dir: Path) -> "FleetRecord":
        path = state_dir / FLEET_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise LocalFleetError(f"no local fleet in {state_dir} (no {FLEET_FILE}); start one with `fleetctl up`",
                                  code="no_fleet", status=404) from None
        try:
            return cls(**{**data, "processes": [ProcessInfo(**p) for p in data["processes"]]})
        except (KeyError, TypeError) as exc:
            raise LocalFleetError(f"{path} is not a fleet record ({exc}); stop its processes by hand") from None

    def of_kind(self, kind: str) -> list[ProcessInfo]:
        return [p for p in self.processes if p.kind == kind]


# --- up ---------------------------------------------------------------------------------------------------


def up(options: UpOptions, progress: Progress) -> FleetRecord:
    """Start the fleet and wait for its engines. On failure, stops what it started and raises."""
    state_dir = options.state_dir.resolve()
    _refuse_if_running(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    record = FleetRecord(state_dir=str(state_dir), controller_url="", token_file=str(bootstrap_token_path(state_dir)),
                         log_dir=str(state_dir / "logs"), model=options.model, served_model=SERVED_NAMES[options.model],
                         hash_seed=fleet_hash_seed(state_dir))
    try:
        _start_controller(record, options, progress)
        _start_agents(record, options, progress)
        _start_gateway(record, options, progress)
        _apply_default_deployment(record, options, progress)
        wait_engines_ready(record, options.nodes, options.ready_timeout_s, progress)
        wait_gateway_routes(record, options.nodes, 60.0, progress)
        record.save()
        write_local_inventory(record)
    except BaseException:
        if record.processes:  # each start was saved to fleet.json, so `down` finds them
            progress("start-up failed; stopping what was started")
            down(state_dir, timeout_s=20.0)
        raise
    return record


def fleet_hash_seed(state_dir: Path) -> str:
    """The seed the state dir's fleet hashes prefixes with, recorded at its first start and never changed
    after: engines, gateways and the prefix index must agree on it, and engines keep cached blocks across a
    gateway restart. A state dir that already held a fleet before seeds were recorded (a fleet.json without
    the file) keeps the old default, "0"; a new one takes FLEET_HASH_SEED, else vLLM's default. An explicit
    FLEET_HASH_SEED that contradicts the recorded seed is refused rather than followed."""
    path = state_dir / HASH_SEED_FILE
    wanted = os.environ.get(HASH_SEED_ENV)
    if path.exists():
        seed = path.read_text().strip()
        if wanted is not None and wanted != seed:
            raise LocalFleetError(f"the fleet in {state_dir} hashes prefixes with seed {seed!r} ({path}), but "
                                  f"{HASH_SEED_ENV} is {wanted!r}: unset it, or start a new fleet in another state dir",
                                  code="hash_seed_mismatch", field="hash_seed", status=409)
        return seed
    seed = LEGACY_HASH_SEED if (state_dir / FLEET_FILE).exists() and wanted is None else default_seed()
    path.write_text(seed + "\n")
    return seed


def seed_env(record: FleetRecord) -> dict[str, str]:
    """The variable that gives a process of the fleet its prefix-hash seed."""
    return {HASH_SEED_ENV: record.hash_seed} if record.hash_seed is not None else {}


def _refuse_if_running(state_dir: Path) -> None:
    try:
        record = FleetRecord.load(state_dir)
    except LocalFleetError:
        return
    if any(processes.is_running(p) for p in record.processes):
        raise LocalFleetError(f"a local fleet is already up in {state_dir}; stop it with "
                              f"`fleetctl down --state-dir {state_dir}`", code="fleet_running", status=409)


def controller_command(state_dir: Path, port: int, heartbeat_interval_s: float) -> tuple[list[str], dict[str, str]]:
    """argv and env of a controller on SQLite in `state_dir` (tests restart it with the same pair)."""
    env = {"FLEET_STATE_DIR": str(state_dir), "FLEET_DB_URL": sqlite_url(state_dir),
           "FLEET_HEARTBEAT_INTERVAL_S": str(heartbeat_interval_s)}
    return fleetctl_argv("controller", "serve", "--host", HOST, "--port", str(port)), env


def agent_command(controller_url: str, node: str, token_file: str, api_port: int, port_range: tuple[int, int],
                  state_dir: Path) -> list[str]:
    """argv of one agent."""
    return fleetctl_argv(
        "agent", "serve", "--controller", controller_url, "--node", node, "--token-file", token_file,
        "--host", HOST, "--port", str(api_port), "--port-range", f"{port_range[0]}-{port_range[1]}",
        "--state-dir", str(state_dir),
    )


def _start_controller(record: FleetRecord, options: UpOptions, progress: Progress) -> None:
    state_dir = Path(record.state_dir)
    port = options.controller_port or free_port(HOST)
    if not port_is_free(port):
        raise LocalFleetError(f"controller port {port} is taken: pass --controller-port (0 picks a free one)",
                              code="port_taken", field="controller_port", status=409)
    record.controller_url = f"http://{HOST}:{port}"
    argv, env = controller_command(state_dir, port, options.heartbeat_interval_s)
    info = processes.start("controller", "controller", argv, Path(record.log_dir) / "controller.log", env, record.controller_url)
    _add(record, info)
    progress(f"controller: starting at {record.controller_url} (pid {info.pid})")
    wait_for(lambda: controller_up(record.controller_url), info, 60.0, "controller to answer /healthz")
    wait_for(lambda: Path(record.token_file).exists(), info, 30.0, "the bootstrap token file")
    progress("controller: up")


def restart_controller(record: FleetRecord, heartbeat_interval_s: float = 2.0) -> ProcessInfo:
    """Start the controller again on the same port and store (after it stopped or was killed), as an operator
    would; fleet.json follows, so `down` stops the new one."""
    old = next(p for p in record.processes if p.kind == "controller")
    port = int(record.controller_url.rsplit(":", 1)[1])
    argv, env = controller_command(Path(record.state_dir), port, heartbeat_interval_s)
    new = processes.start("controller", "controller", argv, Path(old.log_path or Path(record.log_dir) / "controller.log"),
                          env, old.url)
    record.processes[record.processes.index(old)] = new
    record.save()
    wait_for(lambda: controller_up(record.controller_url), new, 60.0, "the controller to answer again")
    return new


def restart_agent(record: FleetRecord, node: str, stop_timeout_s: float = 60.0) -> ProcessInfo:
    """Stop a node's agent (SIGTERM: it stops its engines) and start it again with the same command line (port,
    engine ports, state dir), as an operator restarting the service would; fleet.json follows. What the agent
    keeps across it is what it keeps on disk (its disk KV tier, its journal), not what it held in memory."""
    old = next(p for p in record.processes if p.kind == "agent" and p.name == node)
    argv = psutil.Process(old.pid).cmdline()  # whatever `up` chose for it
    processes.stop_all([old], stop_timeout_s)
    log_path = Path(old.log_path or Path(record.log_dir) / f"agent-{node}.log")
    new = processes.start("agent", node, argv, log_path, seed_env(record), url=old.url)
    record.processes[record.processes.index(old)] = new
    record.save()
    wait_for(lambda: agent_up(new.url or ""), new, 60.0, f"agent {node} to answer /health again")
    return new


def controller_up(url: str) -> bool:
    with ControllerClient(url, timeout=2.0) as client:
        try:
            return client.health().ok
        except FleetError:
            return False


def _start_agents(record: FleetRecord, options: UpOptions, progress: Progress) -> None:
    state_dir = Path(record.state_dir)
    for index in range(options.nodes):
        node = f"node-{index + 1}"
        api_port = free_port(HOST)
        low = options.engine_port_base + index * PORTS_PER_NODE
        port_range = (low, low + PORTS_PER_NODE - 1)
        argv = agent_command(record.controller_url, node, record.token_file, api_port, port_range, state_dir / "agents" / node)
        info = processes.start("agent", node, argv, Path(record.log_dir) / f"agent-{node}.log", seed_env(record),
                               url=f"http://{HOST}:{api_port}")
        _add(record, info)
        progress(f"agent {node}: starting (pid {info.pid}, engine ports {port_range[0]}-{port_range[1]})")
    for info in record.of_kind("agent"):
        wait_for(lambda: agent_up(info.url or ""), info, 60.0, f"agent {info.name} to answer /health")
    progress(f"agents: {options.nodes} up")


def agent_up(url: str) -> bool:
    try:
        return AgentClient(url, timeout_s=2.0).health()["status"] == "ok"
    except AgentApiError:
        return False


def gateway_command(controller_url: str, port: int, table_refresh_s: float | None = None,
                    state_dir: Path | None = None, name: str = GATEWAY_NAME) -> list[str]:
    """argv of the local gateway (its controller token travels in the environment, never on the command line).
    With `state_dir` it takes direct (break-glass) overrides on the credential written there. Every engine of a
    local fleet runs on this host's CPUs, so the gateway is told they share hardware (no hot-spot spills, load
    priced half as one pool: fleetctl/gateway/scorer.py)."""
    refresh = [] if table_refresh_s is None else ["--table-refresh-s", str(table_refresh_s)]
    direct = [] if state_dir is None else ["--state-dir", str(state_dir)]
    return fleetctl_argv("gateway", "serve", "--controller", controller_url, "--host", HOST, "--port", str(port),
                         "--name", name, "--log-level", "warning", "--engines-share-hardware", *refresh, *direct)


def _start_gateway(record: FleetRecord, options: UpOptions, progress: Progress) -> None:
    """The OpenAI front door: routes by prefix locality and load over the controller's routing table.
    `down` stops it with the controller."""
    port = options.gateway_port or free_port(HOST)
    if not port_is_free(port):
        raise LocalFleetError(f"gateway port {port} is taken: pass --gateway-port (0 picks a free one)",
                              code="port_taken", field="gateway_port", status=409)
    record.gateway_url = f"http://{HOST}:{port}"
    argv = gateway_command(record.controller_url, port, options.gateway_table_refresh_s,
                           gateway_state_dir(Path(record.state_dir), "gateway"))
    info = processes.start("gateway", "gateway", argv, Path(record.log_dir) / "gateway.log",
                           {"FLEET_TOKEN": _read_token(record), **seed_env(record)}, record.gateway_url)
    _add(record, info)
    progress(f"gateway: starting at {record.gateway_url} (pid {info.pid})")
    wait_for(lambda: gateway_up(record.gateway_url), info, 60.0, "the gateway to load its routing table")
    progress("gateway: up")


def gateway_state_dir(state_dir: Path, name: str) -> Path:
    """Where gateway `name` of the local fleet keeps its direct-mode state (the fleet's own: gateway/)."""
    return state_dir / ("gateway" if name == "gateway" else f"gateway-{name}")


def write_local_inventory(record: FleetRecord) -> Path:
    """STATE_DIR/inventory.yaml: the agents and the gateway with their credential files, for `--direct all`."""
    state_dir = Path(record.state_dir)
    nodes = [{"name": info.name, "kind": "agent", "url": info.url or "",
              "credential_file": str(state_dir / "agents" / info.name / AGENT_CREDENTIAL_FILE)}
             for info in record.of_kind("agent")]
    nodes += [{"name": GATEWAY_NAME if info.name == "gateway" else info.name, "kind": "gateway", "url": info.url or "",
               "credential_file": str(gateway_state_dir(state_dir, info.name) / GATEWAY_CREDENTIAL_FILE)}
              for info in record.of_kind("gateway")]
    path = state_dir / INVENTORY_FILE
    write_inventory(path, nodes)
    return path


def gateway_up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_gateway_routes(record: FleetRecord, expected: int, timeout_s: float, progress: Progress) -> None:
    """Wait until the gateway's table lists `expected` healthy engines (it refreshes every few seconds)."""
    info = record.of_kind("gateway")[0]

    def routes() -> bool:
        try:
            engines = httpx.get(f"{record.gateway_url}/health", timeout=2.0).json().get("engines", {})
        except (httpx.HTTPError, ValueError):
            return False
        return sum(1 for e in engines.values() if e.get("healthy")) >= expected

    wait_for(routes, info, timeout_s, f"the gateway to route to {expected} engine(s)")
    progress(f"gateway: routing to {expected} engine(s)")


def _apply_default_deployment(record: FleetRecord, options: UpOptions, progress: Progress) -> None:
    """A replica class for the model and a deployment with one mixed engine per node (placement spreads)."""
    spec = {"model": record.served_model, "weights": options.model, "kv_cache_mib": options.kv_cache_mib}
    with ControllerClient(record.controller_url, token=_read_token(record)) as client:
        record.class_ref = client.apply_class(options.model, spec, reason="fleetctl up: default class").ref
        client.set_deployment(DEPLOYMENT, record.class_ref, replicas=options.nodes, role="mixed",
                              reason="fleetctl up: default deployment")
    record.save()
    progress(f"deployment {DEPLOYMENT}: {options.nodes} x {record.class_ref} ({record.served_model}), one mixed engine per node")


def wait_engines_ready(record: FleetRecord, expected: int, timeout_s: float, progress: Progress) -> None:
    """Poll the agents until `expected` engines of the deployment's class are ready (engines of an earlier
    class, from a previous `up` on the same state dir, are drained meanwhile); a progress line on change."""
    deadline, started, last = time.monotonic() + timeout_s, time.monotonic(), ""
    while True:
        engines = _engines_from_agents(record)
        current = [e for e in engines if e["class_ref"] == record.class_ref]
        ready = [e for e in current if e["state"] == "ready"]
        line = f"engines: {len(ready)}/{expected} ready" + "".join(
            f"; {e['name']} on {e['node']} ({e['class_ref']}): {e['state']}"
            + (f" ({e['last_exit']})" if e.get("last_exit") else "")
            for e in engines if e not in ready)
        if line != last:
            progress(f"{line}  [{time.monotonic() - started:.0f}s]")
            last = line
        if len(ready) >= expected:
            record.engines = ready  # saved by `up` once the gateway routes to them too: then the fleet is up
            return
        for info in record.processes:
            if (how := processes.exit_status(info)) is not None:
                raise LocalFleetError(f"{info.kind} {info.name} exited ({how}) while waiting for engines; see {info.log_path}")
        if time.monotonic() >= deadline:
            raise LocalFleetError(f"engines not ready after {timeout_s:.0f}s ({line}); see the engine logs under "
                                  f"{record.state_dir}/agents/*/logs")
        time.sleep(1.0)


def _engines_from_agents(record: FleetRecord) -> list[dict[str, Any]]:
    engines = []
    for info in record.of_kind("agent"):
        try:
            reported = AgentClient(info.url or "", timeout_s=2.0).engines()
        except AgentApiError:
            continue
        engines += [{"name": e["name"], "node": info.name, "class_ref": e["class_ref"], "url": e["url"],
                     "state": e["state"], "last_exit": e["last_exit"], "pid": e["pid"]} for e in reported]
    return sorted(engines, key=lambda e: e["name"])


def _add(record: FleetRecord, info: ProcessInfo) -> None:
    record.processes.append(info)
    record.save()  # at once: `down` can clean up even if `up` dies half-way


def wait_for(ready: Callable[[], bool], info: ProcessInfo, timeout_s: float, what: str) -> None:
    """Poll `ready` until true; raise when `info`'s process exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if (how := processes.exit_status(info)) is not None:
            raise LocalFleetError(f"{info.kind} {info.name} exited ({how}) before it was up; see {info.log_path}")
        if time.monotonic() >= deadline:
            raise LocalFleetError(f"timed out after {timeout_s:.0f}s waiting for {what}; see {info.log_path}")
        time.sleep(0.2)


def _read_token(record: FleetRecord) -> str:
    return Path(record.token_file).read_text().strip()


# --- down -------------------------------------------------------------------------------------------------


def down(state_dir: Path, timeout_s: float = 60.0) -> list[dict[str, str]]:
    """Stop the fleet in `state_dir`: agents (they stop their engines), stray engines, gateway, controller.
    Returns one row per process: kind, name, pid, result (stopped | killed | not running)."""
    record = FleetRecord.load(state_dir.resolve())
    report = _stop(record.of_kind("agent"), timeout_s)
    report += _stop(_stray_engines(record), timeout_s)
    report += _stop(record.of_kind("gateway") + record.of_kind("controller"), timeout_s)
    (Path(record.state_dir) / FLEET_FILE).unlink(missing_ok=True)
    return report


def _stop(infos: list[ProcessInfo], timeout_s: float) -> list[dict[str, str]]:
    outcome = processes.stop_all(infos, timeout_s)
    return [{"kind": p.kind, "name": p.name, "pid": str(p.pid), "result": outcome[p.name]} for p in infos]


def _stray_engines(record: FleetRecord) -> list[ProcessInfo]:
    """Engines still running after their agent stopped (an agent killed with SIGKILL cannot stop them)."""
    strays = []
    for agent_dir in sorted((Path(record.state_dir) / "agents").glob("*")):
        for rec in read_records(agent_dir / "engines"):
            info = ProcessInfo("engine", rec.name, rec.pid, rec.create_time, log_path=rec.log_path)
            if processes.is_running(info):
                strays.append(info)
    return strays
