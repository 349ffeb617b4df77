"""Send the warm requests prefix_warming.py plans: a popular prefix's token ids to an idle engine, one output
token, in the background. While one is in flight the engine carries it as an in-flight prompt, so the scorer
sees both the prefill queued there and the prefix it will hold.

A warm yields to a real request: when a request (or a probe) is sent to an engine still warming, the warm is
cancelled. Its stream closes, the engine aborts it at once, and the request is scheduled without the rest of
the warm's prefill ahead of it (the blocks the warm already completed stay in the engine's prefix cache). A
warm is streamed for that reason: an engine notices a closed stream at once, a closed non-streamed request
only at its next poll."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence

from fleetctl.gateway.engine_state import EngineLive, InFlight
from fleetctl.gateway.metrics import GatewayMetrics
from fleetctl.gateway.prefix_warming import WarmPlan
from fleetctl.gateway.routing_table import EngineRoute
from fleetctl.gateway.upstream import (END, PENDING, TRANSPORT_ERRORS, EngineRejected, SSEReader, UpstreamFailure,
                                       failure_from_exception, open_stream)
from fleetctl.httpwire import EngineClient

log = logging.getLogger("fleetctl.gateway.warm")
_warm_ids = itertools.count(1)


def warm_body(model: str, prompt_ids: Sequence[int], blocks: int, block_size: int) -> dict:
    """A completion of the prompt's first `blocks` blocks as token ids (the engine hashes exactly these tokens,
    as it will the real request's), greedy, one output token: the prefill is the point."""
    return {"model": model, "prompt": list(prompt_ids[: blocks * block_size]), "max_tokens": 1, "temperature": 0,
            "stream": True}


class PrefixWarmer:
    def __init__(self, client: EngineClient, headers: Callable[[], dict[str, str]], metrics: GatewayMetrics,
                 connect_timeout_s: float, timeout_s: float):
        self.client = client
        self.headers = headers
        self.metrics = metrics
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self._tasks: dict[str, asyncio.Task] = {}  # engine -> its warm in flight
        self._yielded: set[asyncio.Task] = set()

    @property
    def warming(self) -> frozenset[str]:
        return frozenset(self._tasks)

    def start(self, plan: WarmPlan, route: EngineRoute, live: EngineLive, prompt_ids: Sequence[int],
              block_hashes: Sequence[int], block_size: int) -> None:
        if plan.engine_id in self._tasks or route.url is None:
            return
        body = warm_body(route.model, prompt_ids, plan.blocks, block_size)
        ticket = live.start(InFlight(len(body["prompt"]), 1, cached_tokens=plan.cached_blocks * block_size,
                                     block_hashes=tuple(block_hashes[: plan.blocks])))
        task = asyncio.create_task(self._warm(route, body), name=f"warm-{plan.engine_id}")
        self._tasks[plan.engine_id] = task
        task.add_done_callback(lambda done: self._finished(plan.engine_id, route.name, live, ticket, done))

    def yield_to_request(self, engine_id: str) -> None:
        """A request is being sent to `engine_id`: cancel the warm in flight there, if any."""
        task = self._tasks.pop(engine_id, None)
        if task is not None and not task.done():
            self._yielded.add(task)
            task.cancel()

    def _finished(self, engine_id: str, engine_name: str, live: EngineLive, ticket: InFlight,
                  task: asyncio.Task) -> None:
        # Here, not in the coroutine: a task cancelled before its first step never runs its body.
        live.finish(ticket)
        if self._tasks.get(engine_id) is task:  # not a later warm of the same engine, after this one yielded
            del self._tasks[engine_id]
        outcome = self._outcome(engine_name, task)
        if outcome is not None:
            self.metrics.prefix_warms.labels(engine_name, outcome).inc()
        self._yielded.discard(task)

    def _outcome(self, engine_name: str, task: asyncio.Task) -> str | None:
        """'ok', 'failed' or 'yielded'; None for a warm cancelled because the gateway is stopping."""
        if task.cancelled():
            return "yielded" if task in self._yielded else None
        error = task.exception()
        if error is not None:  # a bug, not the engine's answer: logged, and the warm counted as failed
            log.error("warming on %s raised", engine_name, exc_info=error)
            return "failed"
        return task.result()

    async def _warm(self, route: EngineRoute, body: dict) -> str:
        """The warm's outcome: 'ok' or 'failed' (the probes judge the engine's health, not a warm)."""
        headers = {**self.headers(), "x-request-id": f"warm-{next(_warm_ids)}"}
        try:
            await self._prefill(route.url or "", headers, body)
            return "ok"
        except (UpstreamFailure, EngineRejected) as exc:
            log.info("warming %d tokens on %s failed: %s", len(body["prompt"]), route.name, exc)
            return "failed"

    async def _prefill(self, url: str, headers: dict[str, str], body: dict) -> None:
        """The warm request, read to its end (closing the stream early aborts it in the engine)."""
        response = await open_stream(self.client, url, "/v1/completions", body, headers, self.connect_timeout_s,
                                     self.timeout_s)
        reader = SSEReader(response)
        try:
            while True:
                try:
                    event = await reader.next(self.timeout_s)
                except TRANSPORT_ERRORS as exc:
                    raise failure_from_exception(exc, url) from None
                if event is PENDING:
                    raise UpstreamFailure("timeout", f"{url}: the warm sent nothing for {self.timeout_s:g}s")
                if event is END or event.is_done:
                    return
                if "error" in (event.json() or {}):
                    raise UpstreamFailure("error_event", f"{url}: {event.data}")
        finally:
            await reader.close()

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
