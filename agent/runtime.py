"""One agent process: the supervisor, the heartbeat loop and the local API on one asyncio loop.

Start-up: re-adopt engines a previous agent left running (agent/process.py records), serve the local API,
register and heartbeat. Each heartbeat reply's assignment becomes the supervisor's desired state.
Shut-down (SIGTERM / SIGINT): stop heartbeating, stop the engines (SIGTERM, then SIGKILL after
stop_timeout_s) unless `keep_engines_on_exit`, in which case the next agent re-adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from agent.api import make_api
from agent.direct_sync import DirectSync
from agent.heartbeat import ControllerLink, HeartbeatLoop
from agent.kv_tiers.control import TierControl
from agent.settings import AgentSettings
from agent.supervisor import BreakGlass, Supervisor
from engine.contract import EngineAssignment
from engine.contract.direct import DirectAction, DirectJournal

log = logging.getLogger("fleetctl.agent")

AGENT_VERSION = "0.1.0"


class AgentStartError(Exception):
    """The agent cannot start (its API port is taken, ...); the message says what to change."""


class Agent:
    def __init__(self, settings: AgentSettings, link: ControllerLink):
        self.settings = settings
        self.supervisor = Supervisor(settings)
        self.credential = settings.admin_token  # the break-glass credential; POST /direct/rotate replaces it
        self.journal = DirectJournal(settings.direct_dir)
        self.direct = DirectSync(link, settings.node, self.journal, self.supervisor)
        self.heartbeat = HeartbeatLoop(
            link, registration=registration(settings), observe=self.supervisor.observed,
            on_assignment=self._on_assignment, backoff=settings.controller_backoff, after_exchange=self.direct.sync,
            tiers=TierControl(self.supervisor.tiers),
        )
        self.stop = asyncio.Event()
        self.wake = asyncio.Event()

    def link_status(self) -> dict[str, Any]:
        return self.heartbeat.status.as_dict(self.heartbeat.clock())

    def break_glass(self, name: str, action: BreakGlass, reason: str | None = None,
                    client: str | None = None) -> DirectAction:
        """A direct action: journalled (fsynced) first, then done. Raises KeyError for an unknown engine."""
        if name not in self.supervisor.slots:
            raise KeyError(name)
        entry = self.journal.append(action, name, reason=reason, client=client)
        self.supervisor.break_glass(name, action, entry.seq)
        self.wake.set()
        return entry

    def _on_assignment(self, generation: int, assignment: list[EngineAssignment]) -> None:
        new_generation = generation != self.heartbeat.status.generation
        self.supervisor.set_desired(assignment)
        if new_generation:
            log.info("assignment generation %d: %s", generation, ", ".join(a.name for a in assignment) or "none")
            self.wake.set()

    async def run(self, api_socket: socket.socket) -> None:
        """Until `stop` is set (by a signal, or a test). The local API is served on `api_socket`."""
        adopted = self.supervisor.adopt_running()
        if adopted:
            log.info("re-adopted running engines: %s", ", ".join(adopted))
        server = _QuietServer(uvicorn.Config(make_api(self), host=self.settings.host, port=self.settings.port,
                                             log_level="warning", lifespan="off"))
        tasks = [
            asyncio.create_task(server.serve(sockets=[api_socket]), name="api"),
            asyncio.create_task(self.supervisor.run(self.stop, self.wake), name="supervisor"),
            asyncio.create_task(self.heartbeat.run(self.stop), name="heartbeat"),
        ]
        log.info("agent %s up: API %s, controller %s", self.settings.node, self.settings.api_url, self.settings.controller_url)
        await self.stop.wait()
        log.info("agent %s stopping%s", self.settings.node, "" if self.settings.keep_engines_on_exit else " its engines")
        await asyncio.gather(*tasks[1:], return_exceptions=True)
        await self.supervisor.shutdown(stop_engines=not self.settings.keep_engines_on_exit)
        server.should_exit = True
        await tasks[0]


def registration(settings: AgentSettings) -> dict[str, Any]:
    return {
        "node": settings.node,
        "url": settings.api_url,
        "labels": settings.labels,
        "capacity": {"engines": settings.max_engines, "kv_mib": settings.kv_mib},
        "agent_version": AGENT_VERSION,
    }


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the agent must stop its engines before it exits."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(settings: AgentSettings, link: ControllerLink) -> None:
    """Run an agent in this process until SIGTERM or SIGINT. Raises AgentStartError before anything starts
    when the API port cannot be bound."""
    api_socket = bind_api_socket(settings.host, settings.port)
    asyncio.run(_serve(settings, link, api_socket))


def bind_api_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AgentStartError(f"cannot listen on {host}:{port} for the agent API ({exc.strerror}); pass another --port") from None
    return sock


async def _serve(settings: AgentSettings, link: ControllerLink, api_socket: socket.socket) -> None:
    agent = Agent(settings, link)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop.set)
    await agent.run(api_socket)
