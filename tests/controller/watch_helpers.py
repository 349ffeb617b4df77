"""Helpers of the change-stream tests: a real controller on loopback whose hub the test ticks by hand
(`background` off: no tick thread, no reconcile loop), a fleet with something of every watched kind, and a
viewer reading the stream through the real client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from canary_store_helpers import add_probes, store_reference
from ctl_helpers import SPEC, Clock

from fleetctl.client import ControllerClient
from fleetctl.controller.server import ServerThread
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens
from fleetctl.controller.watch_contract import WatchMessage
from fleetctl.controller.watch_hub import WatchHub
from fleetctl.watch_client import watch

NODE = "n1"
MODEL = "smollm2-135m"
REGISTRATION = {"node": NODE, "url": "http://n1:9000", "labels": {"zone": "a"},
                "capacity": {"engines": 4, "kv_mib": 64}, "agent_version": "test"}
QUIET_PING_S = 60.0  # no ping arrives during a test that does not ask for one
READ_WAIT_S = 20.0  # the longest a viewer waits for its next message before the test fails


@dataclass
class WatchFleet:
    server: ServerThread
    tokens: dict[str, str]
    clients: list[ControllerClient] = field(default_factory=list)

    @property
    def hub(self) -> WatchHub:
        return self.server.runtime.watch

    def client(self, role: str | None = "operator") -> ControllerClient:
        client = ControllerClient(self.server.url, self.tokens[role] if role else None)
        self.clients.append(client)
        return client

    def viewer(self, resume: str | None = None, role: str = "viewer") -> "Viewer":
        return Viewer(watch(self.client(role), resume, silence_s=READ_WAIT_S))

    def tick(self) -> bool:
        return self.hub.tick()


@contextmanager
def watch_fleet(db_url: str, tmp_path: Path, **settings: Any) -> Iterator[WatchFleet]:
    options = {"watch_ping_s": QUIET_PING_S, **settings}
    config = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", port=0, background=False, **options)
    with ServerThread(config) as server:
        fleet = WatchFleet(server, role_tokens(server.runtime.store))
        try:
            yield fleet
        finally:
            for client in fleet.clients:
                client.close()


class Viewer:
    """One connection's messages, read as the test asks for them."""

    def __init__(self, messages: Iterator[WatchMessage]):
        self.messages = messages

    def next(self) -> WatchMessage:
        return next(self.messages)

    def take(self, n: int) -> list[WatchMessage]:
        return [self.next() for _ in range(n)]

    def close(self) -> None:
        self.messages.close()  # type: ignore[attr-defined]


def one_ready_engine(fleet: WatchFleet, metrics: dict[str, float] | None = None) -> str:
    """A class, a one-replica deployment, a node whose agent reports the placed engine ready. Its name."""
    operator, agent = fleet.client("operator"), fleet.client("agent")
    operator.apply_class("chat", SPEC, reason="test")
    operator.set_deployment("chat", "chat@r1", 1, placement={"zone": "a"})
    agent.register_agent(REGISTRATION)
    fleet.server.runtime.step()
    beat = agent.heartbeat({"node": NODE, "generation": 0, "engines": [], "cut_off_s": None})
    (assigned,) = beat.assignment
    report_engine(fleet, assigned.name, beat.generation, metrics or {})
    return assigned.name


def report_engine(fleet: WatchFleet, name: str, generation: int, metrics: dict[str, float], state: str = "ready") -> None:
    observed = {"name": name, "model": MODEL, "class_ref": "chat@r1", "role": "mixed", "state": state,
                "url": "http://n1:8100", "port": 8100, "pid": 42, "restarts": 0, "metrics": metrics}
    fleet.client("agent").heartbeat({"node": NODE, "generation": generation, "engines": [observed], "cut_off_s": None})


def populate(fleet: WatchFleet) -> str:
    """Something of every watched kind: a node and its ready engine, a gateway, a rollout, canary streams, a
    drill, traffic and a flag. The engine's name."""
    engine = one_ready_engine(fleet)
    operator = fleet.client("operator")
    table = operator.routing()
    operator.report_gateway({"name": "gw-1", "url": "http://gw:8000", "generation": table.generation,
                             "table_age_s": 0.5, "refresh_interval_s": 3600})  # never stale during a test
    operator.apply_class("chat", {**SPEC, "max_num_seqs": 128})
    operator.set_traffic(MODEL, {"chat@r1": 1.0})
    operator.start_rollout({"model": MODEL, "to": "chat@r2", "steps": [{"scale": {}}, {"setWeight": 50}]})
    operator.set_flag("pd_push", False, reason="test")
    operator.start_plant_drill(engine, "rope_perturb", 600)
    clock = Clock()
    clock.now = datetime.now(timezone.utc)
    store = SimpleNamespace(runtime=fleet.server.runtime, clock=clock)  # what the probe executor stores
    reference = store_reference(store, "chat@r1")  # type: ignore[arg-type]
    add_probes(store, reference, "chat@r1", 12)  # type: ignore[arg-type]
    fleet.server.runtime.step()  # the verdict reconciler folds the probes into their stream
    return engine
