"""Active probes: every `interval_s`, each engine's GET /health and GET /metrics.

/health not 200 (or unreachable) takes the engine out of rotation at once; the next 200 brings it back.
/metrics feeds the engine's load sample and derived rates (engine_state.EngineLive.take_sample); a scrape
that fails leaves the last sample in place. `on_rates` hears every derived rate (P/D transfer metrics).

The probes go over the request path's kept-alive connections (fleetctl/httpwire.py), not httpx: two GETs per
engine every second were the largest share of an idle gateway's CPU, and most of that was httpx's own layers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetctl.gateway.engine_metrics import SampleRates, parse_engine_metrics
from fleetctl.gateway.engine_state import EngineLive
from fleetctl.httpwire import EngineClient, EngineHTTPError

log = logging.getLogger(__name__)


@dataclass
class EngineProber:
    client: EngineClient
    interval_s: float = 1.0
    timeout_s: float = 1.0
    headers: dict[str, str] = field(default_factory=dict)
    on_rates: Callable[[EngineLive, SampleRates], None] = lambda live, rates: None
    _tasks: dict[str, tuple[EngineLive, asyncio.Task]] = field(default_factory=dict)

    def sync(self, engines: dict[str, EngineLive]) -> None:
        """Probe exactly these engines (a changed URL is a new engine)."""
        for name, (live, task) in list(self._tasks.items()):
            if engines.get(name) is not live:
                task.cancel()
                del self._tasks[name]
        for name, live in engines.items():
            if name not in self._tasks:
                self._tasks[name] = (live, asyncio.create_task(self._run(live), name=f"probe-{name}"))

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _run(self, live: EngineLive) -> None:
        while True:
            await self.probe_once(live)
            await asyncio.sleep(self.interval_s)

    async def probe_once(self, live: EngineLive) -> None:
        try:
            status, _ = await self._get(live, "/health")
        except (EngineHTTPError, asyncio.TimeoutError, OSError) as exc:
            self._down(live, f"unreachable ({type(exc).__name__})")
            return
        if status != 200:
            self._down(live, f"/health answered {status}")
            return
        if not live.healthy:
            log.info("engine %s is healthy again", live.name)
        live.probe_ok()
        await self._scrape(live)

    async def _scrape(self, live: EngineLive) -> None:
        live.begin_scrape()
        try:
            status, body = await self._get(live, "/metrics")
            if status != 200:
                raise ValueError(f"/metrics answered {status}")
            rates = live.take_sample(parse_engine_metrics(body.decode("utf-8", errors="replace")))
        except (EngineHTTPError, asyncio.TimeoutError, OSError, ValueError) as exc:
            log.debug("scrape of %s failed: %r", live.name, exc)
            live.scrape_failed()
            return
        if rates is not None:
            self.on_rates(live, rates)

    async def _get(self, live: EngineLive, path: str) -> tuple[int, bytes]:
        """Status and body of one GET, within `timeout_s` in all (connect, headers and body)."""
        async def call() -> tuple[int, bytes]:
            response = await self.client.request("GET", f"{live.url}{path}", b"", self.headers, self.timeout_s)
            try:
                return response.status, await response.read()
            finally:
                await response.aclose()

        return await asyncio.wait_for(call(), self.timeout_s)

    def _down(self, live: EngineLive, reason: str) -> None:
        if live.healthy:
            log.warning("engine %s is down: %s", live.name, reason)
        live.mark_down(reason)
