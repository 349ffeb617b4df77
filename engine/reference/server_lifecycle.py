"""The engine's lifecycle as the HTTP server sees it: ready, draining, exit.

A drain (POST /drain, or SIGTERM via __main__) refuses new generation requests (503 with Retry-After:
`EngineDraining`), lets the ones in flight finish for up to `grace_s`, also waits (within the same grace) for
whatever `wait_also` reports (K/V still held for a pull), then calls `on_exit` so the process stops.
Invariant: `in_flight` counts requests admitted and not yet left; every `admit()` is paired with one `leave()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from engine.errors import EngineDraining

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # the Retry-After of a 429 or 503: overloaded or draining


class Lifecycle:
    """Counts in-flight generation requests and runs the drain: refuse new ones, let old ones finish, exit."""

    def __init__(self, grace_s: float, on_exit: Callable[[], None] | None):
        self.grace_s = grace_s
        self.on_exit = on_exit
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._drain_task: asyncio.Task | None = None

    async def refuse_while_draining(self) -> None:
        """A route dependency: 503 (EngineDraining) once the drain started."""
        if self.draining:
            raise EngineDraining("the engine is draining; retry on another engine")

    def admit(self) -> None:
        if self.draining:
            raise EngineDraining("the engine is draining; retry on another engine")
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def start_drain(self, wait_also: Callable[[], bool] = lambda: False) -> None:
        """Idempotent. `wait_also` is polled too (e.g. K/V still held for a pull)."""
        if self._drain_task is None:
            self.draining = True
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(wait_also))

    async def _drain(self, wait_also: Callable[[], bool]) -> None:
        log.info("draining: %d request(s) in flight, grace %.1fs", self.in_flight, self.grace_s)
        deadline = time.monotonic() + self.grace_s
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.grace_s)
        while wait_also() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.in_flight:
            log.warning("drain grace over with %d request(s) still in flight", self.in_flight)
        if self.on_exit is not None:
            self.on_exit()
