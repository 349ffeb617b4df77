"""Send the warm requests prefix_warming.py plans: a popular prefix's token ids to an idle engine, one output
token, in the background. While one is in flight the engine carries it as an in-flight prompt, so the scorer
sees both the prefill queued there and the prefix it will hold."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence

from fleetctl.gateway.engine_state import EngineLive, InFlight
from fleetctl.gateway.metrics import GatewayMetrics
from fleetctl.gateway.prefix_warming import WarmPlan
from fleetctl.gateway.routing_table import EngineRoute
from fleetctl.gateway.upstream import EngineRejected, UpstreamFailure, post_json
from fleetctl.httpwire import EngineClient

log = logging.getLogger("fleetctl.gateway.warm")
_warm_ids = itertools.count(1)


def warm_body(model: str, prompt_ids: Sequence[int], blocks: int, block_size: int) -> dict:
    """A completion of the prompt's first `blocks` blocks as token ids (the engine hashes exactly these tokens,
    as it will the real request's), greedy, one output token: the prefill is the point."""
    return {"model": model, "prompt": list(prompt_ids[: blocks * block_size]), "max_tokens": 1, "temperature": 0}


class PrefixWarmer:
    def __init__(self, client: EngineClient, headers: Callable[[], dict[str, str]], metrics: GatewayMetrics,
                 connect_timeout_s: float, timeout_s: float):
        self.client = client
        self.headers = headers
        self.metrics = metrics
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self._tasks: dict[str, asyncio.Task] = {}  # engine -> its warm in flight

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
        task = asyncio.create_task(self._warm(route, live, ticket, body), name=f"warm-{plan.engine_id}")
        self._tasks[plan.engine_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(plan.engine_id, None))

    async def _warm(self, route: EngineRoute, live: EngineLive, ticket: InFlight, body: dict) -> None:
        headers = {**self.headers(), "x-request-id": f"warm-{next(_warm_ids)}"}
        outcome = "failed"
        try:
            await post_json(self.client, route.url or "", "/v1/completions", body, headers, self.connect_timeout_s,
                            self.timeout_s)
            outcome = "ok"
        except (UpstreamFailure, EngineRejected) as exc:  # the probes judge the engine's health, not a warm
            log.info("warming %d tokens on %s failed: %s", len(body["prompt"]), route.name, exc)
        finally:
            live.finish(ticket)
            self.metrics.prefix_warms.labels(route.name, outcome).inc()

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
