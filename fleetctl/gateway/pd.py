"""P/D orchestration with vLLM's proxy protocol (so real vLLM engines with the NIXL connector work too):

1. prefill: the client's body with `stream: false`, `max_tokens: 1` (and max_completion_tokens, min_tokens
   adjusted), and `kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false,
   "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}`, sent to the
   best prefill engine (prefix locality + prefill load). Our push extension, for reference-engine classes
   unless the flag `pd_push` is false: `"push_to": <the chosen decode engine's URL>`, so the prefill engine
   pushes each block as it is computed. A prefill that fails is replayed on the next prefill engine.
2. decode: the client's body, unchanged but for the prefill answer's `kv_transfer_params`, sent to the best
   decode engine (decode load and KV headroom); its answer (streamed or not) is the client's. A decode
   engine that fails before its first token is replaced by the next one: it pulls the blocks the prefill
   engine still holds (or recomputes: never a wrong answer).

Every handoff is measured: fleet_gateway_pd_queue_seconds (arrival to prefill sent),
fleet_gateway_pd_prefill_seconds, fleet_gateway_pd_decode_first_byte_seconds (streams), K/V bytes (from the
prefill's block count and the engine's bytes per block), and fleet_gateway_pd_handoffs_total{result}.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

from fleetctl.flag_catalog import value_of
from fleetctl.gateway.dispatch import Dispatcher, RequestContext, Sent, StreamStart
from fleetctl.gateway.engine_state import InFlight
from fleetctl.gateway.errors import UpstreamFailed
from fleetctl.gateway.requests import ClientRequest
from fleetctl.gateway.routing_table import EngineRoute
from fleetctl.gateway.service import Prepared

PUSH_FLAG = "pd_push"
PREFILL_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                     "remote_block_ids": None, "remote_host": None, "remote_port": None}


def prefill_body(body: dict[str, Any], push_to: str | None) -> dict[str, Any]:
    """The prefill request of vLLM's proxy protocol, from the client's body."""
    prefill = copy.deepcopy(body)
    prefill["stream"] = False
    prefill.pop("stream_options", None)
    prefill["max_tokens"] = 1
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    if prefill.get("min_tokens"):
        prefill["min_tokens"] = 0
    params = dict(PREFILL_KV_PARAMS)
    if push_to:
        params["push_to"] = push_to
    prefill["kv_transfer_params"] = params
    return prefill


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    decode = copy.deepcopy(body)
    if kv_transfer_params is not None:
        decode["kv_transfer_params"] = kv_transfer_params
    return decode


def wants_push(prepared: Prepared) -> bool:
    return bool(value_of(prepared.flags, PUSH_FLAG)) and prepared.spec.backend == "reference"


@dataclass
class Prefilled:
    route: EngineRoute
    kv_transfer_params: dict[str, Any] | None


class PDHandoff:
    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self.service = dispatcher.service

    async def prefill(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest) -> Prefilled:
        decode_target = prepared.routes[prepared.plan.decode_candidates[0].engine_id]
        body = prefill_body(request.body, decode_target.url if wants_push(prepared) else None)
        sent_at: dict[str, float] = {}

        async def send(route: EngineRoute, ticket: InFlight) -> dict[str, Any]:
            sent_at["t"] = time.monotonic()
            # the prefill's answer is its first (and only) token: the first-token timeout bounds it
            return await self.dispatcher.post(route, request.path, body, ctx, self.dispatcher.settings.first_token_timeout_s)

        try:
            sent = await self.dispatcher.try_engines(ctx, prepared, prepared.plan.candidates, "prefill", 1, send)
        except UpstreamFailed:
            self.service.metrics.pd_handoffs.labels(prepared.model, "prefill_failed").inc()
            raise
        sent.live.finish(sent.ticket)
        self._measure_prefill(ctx, prepared, sent, sent_at["t"])
        ctx.prefilled_by = sent.route.name
        self.service.sessions.set(ctx.session_id, sent.route.name)
        return Prefilled(sent.route, sent.result.get("kv_transfer_params"))

    def _measure_prefill(self, ctx: RequestContext, prepared: Prepared, sent: Sent[dict[str, Any]], sent_at: float) -> None:
        metrics, model = self.service.metrics, prepared.model
        metrics.pd_queue.labels(model).observe(sent_at - ctx.arrived)
        metrics.pd_prefill.labels(model).observe(time.monotonic() - sent_at)
        params = sent.result.get("kv_transfer_params") or {}
        blocks = params.get("remote_block_ids")
        per_block = sent.live.sample.kv_bytes_per_block if sent.live.sample else None
        if isinstance(blocks, list) and per_block:
            metrics.pd_kv_bytes.labels(model).observe(len(blocks) * per_block)

    async def open_stream(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest) -> StreamStart:
        prefilled = await self.prefill(ctx, prepared, request)
        body = decode_body(request.body, prefilled.kv_transfer_params)
        sent_at: dict[str, float] = {}

        async def send(route: EngineRoute, ticket: InFlight) -> Any:
            sent_at["t"] = time.monotonic()
            return await self.dispatcher.open_until_first_token(route, ticket, request.path, body, ctx)

        sent = await self._decode(ctx, prepared, send)
        self.service.metrics.pd_decode_first_byte.labels(prepared.model).observe(time.monotonic() - sent_at["t"])
        return StreamStart(sent)

    async def complete(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest) -> Sent[dict[str, Any]]:
        prefilled = await self.prefill(ctx, prepared, request)
        body = decode_body(request.body, prefilled.kv_transfer_params)

        async def send(route: EngineRoute, ticket: InFlight) -> dict[str, Any]:
            return await self.dispatcher.post(route, request.path, body, ctx)

        return await self._decode(ctx, prepared, send)

    async def _decode(self, ctx: RequestContext, prepared: Prepared, send: Any) -> Sent[Any]:
        metrics = self.service.metrics
        try:
            sent = await self.dispatcher.try_engines(ctx, prepared, prepared.plan.decode_candidates, "decode",
                                                     prepared.max_tokens, send)
        except UpstreamFailed:
            metrics.pd_handoffs.labels(prepared.model, "decode_failed").inc()
            raise
        metrics.pd_handoffs.labels(prepared.model, "ok").inc()
        ctx.served_by = f"{prepared.class_ref} {sent.route.name}"
        return sent
