"""The heartbeat loop: register with the controller, then report observed state every few seconds and take
the desired assignment and its generation from each reply (docs/contracts.md, "Agent <-> controller").

When the controller cannot be reached the loop retries with exponential backoff and full jitter
(`agent.backoff`), so the agents of a whole fleet do not all knock on a restarted controller at once. Nothing
else waits for it: engines keep running and serving on their last assignment. The first beat that gets
through says how long the agent was cut off (`cut_off_s`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agent.backoff import Backoff, Uniform
from engine.contract import EngineAssignment, EngineObserved

log = logging.getLogger("fleetctl.agent.heartbeat")

DEFAULT_INTERVAL_S = 5.0  # until the controller says otherwise


class RegisterReply(Protocol):
    """The controller's answer to a registration (fleetctl's RegisterResponse has this shape)."""

    @property
    def heartbeat_interval_s(self) -> float: ...


class HeartbeatReply(Protocol):
    """The controller's answer to a heartbeat (fleetctl's HeartbeatResponse has this shape)."""

    @property
    def generation(self) -> int: ...

    @property
    def assignment(self) -> list[EngineAssignment]: ...

    @property
    def heartbeat_interval_s(self) -> float: ...


class NodeTiers(Protocol):
    """The node's KV tiers on the heartbeat (agent.kv_tiers.control.TierControl)."""

    def beat_fields(self) -> dict[str, Any]: ...

    async def apply(self, kv: Any) -> None: ...


class ControllerLink(Protocol):
    """What the loop needs of the controller client (fleetctl.client.AsyncControllerClient has it; the agent
    does not import it, so the replies are described structurally). Failures raise; an exception with
    `status == 404` means the controller does not know this node."""

    async def register_agent(self, payload: dict[str, Any]) -> RegisterReply: ...

    async def heartbeat(self, payload: dict[str, Any]) -> HeartbeatReply: ...

    async def upload_direct_actions(self, payload: dict[str, Any]) -> Any: ...


@dataclass
class LinkStatus:
    """How the agent's connection to the controller stands, as the local API shows it."""

    registered: bool = False
    connected: bool = False
    generation: int | None = None
    heartbeat_interval_s: float = DEFAULT_INTERVAL_S
    failures: int = 0  # consecutive failed exchanges: the backoff's attempt number
    cut_off_since: float | None = None  # monotonic time of the first failure of the current streak
    last_cut_off_s: float | None = None  # how long the last cut-off lasted
    last_error: str | None = None
    last_ok_at: float | None = None  # monotonic

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "registered": self.registered,
            "connected": self.connected,
            "generation": self.generation,
            "cut_off_s": None if self.cut_off_since is None else round(now - self.cut_off_since, 3),
            "last_cut_off_s": self.last_cut_off_s,
            "last_heartbeat_age_s": None if self.last_ok_at is None else round(now - self.last_ok_at, 3),
            "last_error": self.last_error,
        }


class HeartbeatLoop:
    def __init__(
        self,
        link: ControllerLink,
        *,
        registration: dict[str, Any],
        observe: Callable[[], list[EngineObserved]],
        on_assignment: Callable[[int, list[EngineAssignment]], None],
        backoff: Backoff,
        uniform: Uniform = random.uniform,
        clock: Callable[[], float] = time.monotonic,
        after_exchange: Callable[[], Awaitable[None]] | None = None,
        tiers: NodeTiers | None = None,
    ):
        self.link = link
        self.registration = registration
        self.observe = observe
        self.on_assignment = on_assignment
        self.backoff = backoff
        self.uniform = uniform
        self.clock = clock
        self.after_exchange = after_exchange  # e.g. the direct-action upload; its failure is its own
        self.tiers = tiers  # the node's KV tiers: reported on each beat, directed by each reply
        self.status = LinkStatus()

    @property
    def node(self) -> str:
        return str(self.registration["node"])

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: exchange, then wait the heartbeat interval (or the backoff delay after a failure)."""
        while not stop.is_set():
            await _sleep(stop, await self.exchange_or_backoff())

    async def exchange_or_backoff(self) -> float:
        """One exchange. Returns the seconds to wait before the next one."""
        try:
            await self.exchange()
        except Exception as exc:  # every failure is retried; what failed is reported, not fatal
            return self._failed(exc)
        return self.status.heartbeat_interval_s

    async def exchange(self) -> None:
        """Register if not yet registered, then one heartbeat; apply the reply's assignment."""
        status = self.status
        if not status.registered:
            reply = await self.link.register_agent(self.registration)
            status.registered = True
            status.heartbeat_interval_s = reply.heartbeat_interval_s or status.heartbeat_interval_s
            log.info("registered node %s with the controller", self.node)
        cut_off_s = None if status.cut_off_since is None else round(self.clock() - status.cut_off_since, 3)
        beat = await self.link.heartbeat(self._payload(cut_off_s))
        self._succeeded(cut_off_s)
        status.heartbeat_interval_s = beat.heartbeat_interval_s or status.heartbeat_interval_s
        generation = beat.generation
        self.on_assignment(generation, list(beat.assignment))
        status.generation = generation
        if self.tiers is not None:
            await self.tiers.apply(getattr(beat, "kv", None))
        if self.after_exchange is not None:
            await self.after_exchange()

    def _payload(self, cut_off_s: float | None) -> dict[str, Any]:
        return {
            "node": self.node,
            "generation": self.status.generation or 0,
            "engines": [engine.model_dump(mode="json") for engine in self.observe()],
            "cut_off_s": cut_off_s,
            **(self.tiers.beat_fields() if self.tiers is not None else {}),
        }

    def _succeeded(self, cut_off_s: float | None) -> None:
        status = self.status
        if cut_off_s is not None:
            log.warning("controller reachable again after %.1fs cut off", cut_off_s)
            status.last_cut_off_s = cut_off_s
        status.connected, status.failures, status.cut_off_since = True, 0, None
        status.last_error, status.last_ok_at = None, self.clock()

    def _failed(self, exc: Exception) -> float:
        status = self.status
        if getattr(exc, "status", None) == 404:
            status.registered = False  # the controller forgot this node (a new database): register again
        if status.cut_off_since is None:
            status.cut_off_since = self.clock()
        delay = self.backoff.delay(status.failures, self.uniform)
        status.connected, status.failures = False, status.failures + 1
        status.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("controller exchange failed (%s); retry %d in %.2fs", status.last_error, status.failures, delay)
        return delay


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
