"""A real controller on loopback for the TUI's action tests (uvicorn in a thread, SQLite, its reconcilers
running), with a minimal agent loop whose heartbeats report every assigned engine ready, classes chat@r1
and chat@r2 (a performance-only difference), and the fleet's state read back through the API as a
WatchSnapshot for the app's scripted stream."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.client import AsyncControllerClient, ControllerClient
from fleetctl.controller.server import ServerThread
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens
from fleetctl.controller.watch_contract import WatchSnapshot

MODEL = "smollm2-135m"
SPEC = {"model": MODEL, "weights": "smollm2"}


@dataclass
class Controller:
    server: ServerThread
    tokens: dict[str, str]

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, role: str = "admin") -> ControllerClient:
        return ControllerClient(self.url, self.tokens[role])

    def async_client(self, role: str = "operator") -> AsyncControllerClient:
        return AsyncControllerClient(self.url, self.tokens[role])

    def actor(self, role: str) -> str:
        """The token name the audit log records for `role`'s token (role_tokens names them test-ROLE-xxxxxx)."""
        with self.client("admin") as api:
            return next(t.name for t in api.list_tokens() if t.role == role and t.name.startswith(f"test-{role}-"))


@contextmanager
def controller(tmp_path: Path) -> Iterator[Controller]:
    # Nodes registered here may send no heartbeats: a generous down-after keeps them up for the whole test.
    settings = ControllerSettings(db_url=f"sqlite:///{tmp_path / 'fleet.db'}", state_dir=tmp_path / "state", port=0,
                                  heartbeat_interval_s=0.2, down_after_s=60, reconcile_interval_s=0.1)
    with ServerThread(settings) as server:
        yield Controller(server, role_tokens(server.runtime.store))


def register(ctl: Controller, node: str, engines: int = 4) -> ControllerClient:
    client = ControllerClient(ctl.url, ctl.tokens["agent"])
    client.register_agent({"node": node, "url": f"http://{node}", "labels": {},
                           "capacity": {"engines": engines, "kv_mib": 1}, "agent_version": "test"})
    return client


@contextmanager
def agent(ctl: Controller, node: str = "n1", engines: int = 4) -> Iterator[None]:
    """Heartbeats every 50 ms, reporting every assigned engine ready (drained ones gone, as an agent does
    once it stopped them)."""
    stop = threading.Event()
    client = register(ctl, node, engines)

    def loop() -> None:
        generation, reported = 0, []
        while not stop.is_set():
            reply = client.heartbeat({"node": node, "generation": generation, "engines": reported, "cut_off_s": None})
            generation = reply.generation
            reported = [{"name": a.name, "model": a.model, "class_ref": a.class_ref, "role": a.role, "state": "ready",
                         "url": "http://127.0.0.1:1", "metrics": {}} for a in reply.assignment if not a.drain]
            stop.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        client.close()


def serve_chat(ctl: Controller) -> None:
    """chat@r1 serving MODEL with all its traffic (one ready engine), chat@r2 applied."""
    with ctl.client("operator") as api:
        api.apply_class("chat", SPEC)
        api.apply_class("chat", {**SPEC, "max_num_seqs": 128})
        api.set_deployment("chat", "chat@r1", 1)
        wait_for(lambda: api.get_traffic(MODEL).revisions[0].ready_engines == 1)
        api.set_traffic(MODEL, {"chat@r1": 100})


def wait_for(condition: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


async def wait_until(condition: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """`wait_for` for a test that runs inside the app's event loop: it yields between looks."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def snapshot_of(ctl: Controller, seq: int = 1) -> WatchSnapshot:
    """The fleet as the controller's read routes show it now, as the stream's snapshot would carry it."""
    with ctl.client("viewer") as api:
        models = [MODEL]
        resources: dict[str, dict[str, dict[str, Any]]] = {
            "rollout": {str(r.id): r.model_dump(mode="json") for r in api.list_rollouts()},
            "traffic": {m: api.get_traffic(m).model_dump(mode="json") for m in models},
            "gateway": {g.name: g.model_dump(mode="json") for g in api.list_gateways()},
            "node": {n.name: n.model_dump(mode="json") for n in api.list_nodes()},
            "engine": {f"{e.node}/{e.name}": e.model_dump(mode="json") for e in api.list_engines()},
        }
    return WatchSnapshot(token=f"e1-{seq}", at="2026-03-14T09:26:53+00:00", ping_s=2.0, resources=resources)


def audit_of(ctl: Controller, actor: str) -> list[Any]:
    """What `actor` did, oldest first."""
    with ctl.client("admin") as api:
        return sorted(api.list_audit(actor=actor), key=lambda e: e.id)
