"""A real fleet for the rollout process tests: one or two controllers (SQLite, or PostgreSQL for the leader
test), agents running tiny reference engines, and a gateway refreshing its routing table every 0.5 s, all on
loopback and started by the same code as `fleetctl up` (fleetctl/localfleet/). Class revisions A and B of
the model `tiny` (and a slow B) are applied through the API; A's deployments are up and hold 100% of the
traffic before a test starts.

Every process is recorded in STATE_DIR/fleet.json as it starts, so `fleetctl.localfleet.down` stops all of
them by PID (agents first, which drain their engines; then stray engines; then gateway and controllers),
whatever a test did to them.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.ports import free_port
from agent.process import ManagedProcess
from fleetctl.client import ControllerClient
from fleetctl.errors import FleetError
from fleetctl.localfleet import FleetRecord, down, processes
from fleetctl.localfleet.fleet import agent_command, agent_up, controller_up, gateway_command, gateway_up
from fleetctl.localfleet.processes import ProcessInfo, fleetctl_argv
from tests.fleet.fleet_helpers import wait_until  # noqa: F401 (the rollout tests take it from here)

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny"
HOST = "127.0.0.1"
TABLE_REFRESH_S = 0.5
READY_TIMEOUT_S = 240.0  # engines load on a busy 2-core machine
PORTS_PER_NODE = 100

# The class revisions: B differs from A in performance fields only (a rollout needs no
# allowCorrectnessChange); SLOW is B made slow by the test-only engine flag (latency per engine step).
BASE_CLASS = {"model": MODEL, "weights": "tiny", "kv_cache_mib": 16, "max_num_seqs": 8}
CLASSES = {
    "A": BASE_CLASS,
    "B": {**BASE_CLASS, "max_num_seqs": 16},
    "SLOW": {**BASE_CLASS, "max_num_seqs": 12, "engine_args": {"debug-step-delay-ms": 300}},
}

@dataclass(frozen=True)
class FleetOptions:
    nodes: int = 2
    controllers: int = 1  # more than one needs a PostgreSQL db_url: they elect a leader
    db_url: str | None = None  # None: SQLite in the state dir
    roles: tuple[str, ...] = ("mixed",)  # A's deployments, one per role (P/D: prefill and decode)
    replicas: int = 2  # A's engines per role
    heartbeat_interval_s: float = 1.0
    reconcile_interval_s: float = 0.5
    controller_args: tuple[str, ...] = ()  # more `fleetctl controller serve` options (the canary's intervals)
    classes: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(CLASSES))  # applied at start


@dataclass
class RolloutFleet:
    state_dir: Path
    options: FleetOptions
    record: FleetRecord
    token: str
    db_url: str
    controller_urls: list[str] = field(default_factory=list)
    serving: int = 0  # index of the controller the agents, the gateway and the clients talk to
    refs: dict[str, str] = field(default_factory=dict)  # "A" | "B" | "SLOW" -> NAME@rN

    # --- reaching it ---

    @property
    def controller_url(self) -> str:
        return self.controller_urls[self.serving]

    @property
    def gateway_url(self) -> str:
        return self.record.gateway_url or ""

    def client(self, index: int | None = None, timeout: float = 10.0) -> ControllerClient:
        url = self.controller_urls[self.serving if index is None else index]
        return ControllerClient(url, token=self.token, timeout=timeout)

    def http(self, method: str, path: str, json: Any = None, index: int | None = None) -> httpx.Response:
        """A raw API call (for status codes and error bodies the typed client turns into exceptions)."""
        url = self.controller_urls[self.serving if index is None else index]
        return httpx.request(method, f"{url}{path}", json=json, timeout=10.0,
                             headers={"authorization": f"Bearer {self.token}"})

    def cli(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """`fleetctl ARGS` as an operator runs it: a subprocess finding the controller and token in its env."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        env.update({"FLEET_CONTROLLER": self.controller_url, "FLEET_TOKEN": self.token, "PYTHONPATH": str(REPO),
                    "FLEET_STATE_DIR": str(self.state_dir / "cli")})
        return subprocess.run(fleetctl_argv(*args), env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout_s)

    def controller_process(self, index: int) -> ProcessInfo:
        return next(p for p in self.record.processes if p.kind == "controller" and p.name == f"controller-{index}")

    def leader(self) -> int | None:
        """The index of the controller that reports itself leader (None: none answers as leader)."""
        for index, url in enumerate(self.controller_urls):
            try:
                with ControllerClient(url, token=self.token, timeout=2.0) as api:
                    if api.status().controller.leader:
                        return index
            except FleetError:
                continue
        return None

    # --- controllers: start, kill, restart ---

    def start_controller(self, index: int, port: int | None = None) -> ProcessInfo:
        port = port or free_port(HOST)
        url = f"http://{HOST}:{port}"
        env = {"FLEET_STATE_DIR": str(self.state_dir / f"controller-{index}"), "FLEET_DB_URL": self.db_url,
               "FLEET_BOOTSTRAP_TOKEN": self.token,
               "FLEET_HEARTBEAT_INTERVAL_S": str(self.options.heartbeat_interval_s),
               "FLEET_RECONCILE_INTERVAL_S": str(self.options.reconcile_interval_s)}
        argv = fleetctl_argv("controller", "serve", "--host", HOST, "--port", str(port), "--log-level", "info",
                             *self.options.controller_args)
        info = processes.start("controller", f"controller-{index}", argv,
                               Path(self.record.log_dir) / f"controller-{index}.log", env, url)
        self._replace(info)
        if index < len(self.controller_urls):
            self.controller_urls[index] = url
        else:
            self.controller_urls.append(url)
        self.record.controller_url = self.controller_url
        self.record.save()
        self._wait_process(lambda: controller_up(url), info, 60.0, f"controller-{index} to answer /healthz")
        return info

    def kill_controller(self, index: int) -> None:
        """SIGKILL, as a crash would (the process and its whole session)."""
        info = self.controller_process(index)
        ManagedProcess(info.pid, info.create_time).send(signal.SIGKILL)
        wait_until(lambda: processes.exit_status(info) is not None or not processes.is_running(info), 10,
                   f"controller-{index} to die")

    def restart_controller(self, index: int) -> ProcessInfo:
        """Start controller `index` again on the same port and database, as an operator would."""
        port = int(self.controller_urls[index].rsplit(":", 1)[1])
        return self.start_controller(index, port)

    # --- the fleet's state ---

    def engines(self) -> list[dict[str, Any]]:
        with self.client() as api:
            return [e.model_dump() for e in api.list_engines()]

    def engine_classes(self) -> dict[str, str]:
        """engine name -> class revision, for every engine the controller knows."""
        return {e["name"]: e["class_ref"] for e in self.engines()}

    def ready_engines(self, ref: str) -> list[dict[str, Any]]:
        return [e for e in self.engines() if e["class_ref"] == ref and e["state"] == "ready" and not e["drain"]]

    def weights(self) -> dict[str, float]:
        with self.client() as api:
            return {ref: w for ref, w in api.get_traffic(MODEL).weights.items() if w > 0}

    def current(self) -> str:
        """The one revision holding all of the model's traffic (between tests, there is always one)."""
        (ref,) = self.weights()
        return ref

    def other(self) -> str:
        """A when B holds the traffic, else B: where the next rollout goes."""
        return self.refs["B"] if self.current() == self.refs["A"] else self.refs["A"]

    def wait_drained(self, ref: str, timeout_s: float = 120.0) -> None:
        """No engine of `ref` left routable: its deployments are at zero and its engines drained away."""
        wait_until(lambda: not [e for e in self.engines() if e["class_ref"] == ref and not e["drain"]
                                and e["state"] in ("ready", "starting", "pending")], timeout_s, f"{ref}'s engines drained")

    def gateway_generation(self) -> int | None:
        try:
            return httpx.get(f"{self.gateway_url}/health", timeout=2.0).json().get("table_generation")
        except (httpx.HTTPError, ValueError):
            return None

    def gateway_applied(self) -> bool:
        """The gateway routes on the controller's current routing table (its generation, or a later one)."""
        with self.client() as api:
            wanted = api.routing().generation
        applied = self.gateway_generation()
        return applied is not None and applied >= wanted

    def gateway_routes(self, ref: str, expected: int) -> bool:
        """The gateway's table lists `expected` healthy engines of revision `ref`."""
        try:
            engines = httpx.get(f"{self.gateway_url}/health", timeout=2.0).json().get("engines", {})
        except (httpx.HTTPError, ValueError):
            return False
        classes = self.engine_classes()
        return sum(1 for name, e in engines.items() if e.get("healthy") and classes.get(name) == ref) >= expected

    # --- bookkeeping ---

    def _replace(self, info: ProcessInfo) -> None:
        self.record.processes = [p for p in self.record.processes if (p.kind, p.name) != (info.kind, info.name)]
        self.record.processes.append(info)
        self.record.save()  # at once: `down` finds it even if the start-up fails half-way

    def _wait_process(self, ready: Callable[[], bool], info: ProcessInfo, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if (how := processes.exit_status(info)) is not None:
                pytest.fail(f"{info.name} exited ({how}) before it was up; see {info.log_path}:\n{log_tail(info)}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}; see {info.log_path}")
            time.sleep(0.2)


def log_tail(info: ProcessInfo, lines: int = 30) -> str:
    try:
        return "\n".join(Path(info.log_path or "").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --- start and stop ---


def start_fleet(state_dir: Path, options: FleetOptions) -> RolloutFleet:
    """Controllers, agents, gateway, classes A/B/SLOW, A's deployments at 100% of the traffic; waits until the
    gateway routes to all of A's engines. On failure, stops what it started."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    token = "fleet_" + secrets.token_urlsafe(24)
    token_file = state_dir / "agent-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    db_url = options.db_url or f"sqlite:///{state_dir / 'fleet.db'}"
    record = FleetRecord(state_dir=str(state_dir), controller_url="", token_file=str(token_file),
                         log_dir=str(state_dir / "logs"), model=MODEL, served_model=MODEL)
    fleet = RolloutFleet(state_dir, options, record, token, db_url)
    try:
        _start_controllers(fleet)
        _start_agents(fleet)
        _start_gateway(fleet)
        _apply_classes_and_a(fleet)
    except BaseException:
        stop_fleet(fleet)
        raise
    return fleet


def stop_fleet(fleet: RolloutFleet) -> None:
    if (fleet.state_dir / "fleet.json").exists():
        down(fleet.state_dir, timeout_s=20.0)


def _start_controllers(fleet: RolloutFleet) -> None:
    fleet.start_controller(0)
    if fleet.options.controllers > 1:
        # the first one takes the leadership before the others start, so the test knows which one to kill
        wait_until(lambda: fleet.leader() == 0, 30, "controller-0 to lead")
        for index in range(1, fleet.options.controllers):
            fleet.start_controller(index)
        fleet.serving = fleet.options.controllers - 1  # agents, gateway and clients use a follower


def _start_agents(fleet: RolloutFleet) -> None:
    base = 20_000 + secrets.randbelow(200) * 100  # a port block of its own, so parallel runs do not collide
    started = []
    for index in range(fleet.options.nodes):
        node = f"node-{index + 1}"
        low = base + index * PORTS_PER_NODE
        api_port = free_port(HOST)
        argv = agent_command(fleet.controller_url, node, fleet.record.token_file, api_port,
                             (low, low + PORTS_PER_NODE - 1), fleet.state_dir / "agents" / node)
        info = processes.start("agent", node, argv, Path(fleet.record.log_dir) / f"agent-{node}.log",
                               url=f"http://{HOST}:{api_port}")
        fleet._replace(info)
        started.append(info)
    for info in started:
        fleet._wait_process(lambda: agent_up(info.url or ""), info, 60.0, f"agent {info.name}")


def _start_gateway(fleet: RolloutFleet) -> None:
    port = free_port(HOST)
    fleet.record.gateway_url = f"http://{HOST}:{port}"
    argv = gateway_command(fleet.controller_url, port) + ["--table-refresh-s", str(TABLE_REFRESH_S)]
    info = processes.start("gateway", "gateway", argv, Path(fleet.record.log_dir) / "gateway.log",
                           {"FLEET_TOKEN": fleet.token}, fleet.gateway_url)
    fleet._replace(info)
    fleet._wait_process(lambda: gateway_up(fleet.gateway_url), info, 60.0, "the gateway")


def deployment_name(role: str) -> str:
    return f"a-{role}"


def _apply_classes_and_a(fleet: RolloutFleet) -> None:
    with fleet.client() as api:
        for key, spec in fleet.options.classes.items():
            fleet.refs[key] = api.apply_class(MODEL, spec, reason=f"rollout test: class {key}").ref
        a = fleet.refs["A"]
        for role in fleet.options.roles:
            api.set_deployment(deployment_name(role), a, replicas=fleet.options.replicas, role=role,
                               reason="rollout test: A")
    expected = fleet.options.replicas * len(fleet.options.roles)
    wait_until(lambda: len(fleet.ready_engines(a)) >= expected, READY_TIMEOUT_S, f"{expected} ready engine(s) of A",
               every_s=1.0)
    with fleet.client() as api:  # traffic only once an engine is ready (the controller refuses it before)
        api.set_traffic(MODEL, {a: 100}, reason="rollout test: all traffic on A")
    wait_until(lambda: fleet.gateway_routes(fleet.refs["A"], expected) and fleet.gateway_applied(), 60,
               "the gateway to route to A's engines")
