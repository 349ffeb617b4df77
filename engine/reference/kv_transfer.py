"""P/D disaggregation: moving a prompt's K/V from a prefill engine to a decode engine.

The handoff follows vLLM's proxy protocol. The prefill request carries `kv_transfer_params:
{"do_remote_decode": true}` (and max_tokens 1); the prefill engine keeps the prompt's blocks after finishing
and answers with `kv_transfer_params: {"do_remote_prefill": true, "remote_block_ids", "remote_host",
"remote_port", "remote_request_id", "num_tokens", "prompt_hash", "remote_kv_port", ...}`, which the proxy copies
into the decode request. The decode engine needs the K/V of the first `prompt_len - 1` tokens (it recomputes
the last prompt token to get logits) and pulls what it does not have, over the side channel when the params
name one (`remote_kv_port`: raw TCP, engine.reference.kv_side_channel), else (or if it cannot connect) over
HTTP (the /kv/* routes, engine.reference.kv_routes). Blocks nobody pulls are freed after
`kv_transfer_timeout_s` (by the engine core).

Push extension: if the prefill request's kv_transfer_params has `"push_to": "<decode engine base URL>"`, the
prefill engine POSTs each block to `<push_to>/kv/push` as soon as it is computed (engine.reference.kv_push).
The decode engine stages pushed blocks by (request_id, logical index) for `kv_transfer_timeout_s` and pulls
only what is missing.

The frame (engine.reference.kv_wire) is the same in both directions and on both transports. Any failed check,
timeout or refused connection is a transfer failure, handled by kv_load_failure_policy (recompute, or fail
with KVTransferError, 502).

Modules, by job: kv_prefill (held blocks, prepared frames, serving pulls), kv_push (the push sender),
kv_decode (staging, pulling, the failure policy), kv_routes (/kv/*), kv_wire (the frame) and kv_side_channel
(raw TCP). `KVTransfer` here is what the server holds: one engine's two sides, the HTTP client, the side
channel's listener and the background tasks they share.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
from fastapi import APIRouter

from engine.errors import InvalidRequest
from engine.reference.engine_port import KVEnginePort
from engine.reference.kv_decode import DecodeSide, ExternalKV, KVStaging
from engine.reference.kv_prefill import HeldBlocks, PrefillSide
from engine.reference.kv_push import PushSender
from engine.reference.kv_routes import kv_router
from engine.reference.kv_side_channel import FrameServer
from engine.reference.kv_wire import POOL
from engine.reference.metrics import EngineMetrics

log = logging.getLogger(__name__)


class KVTransfer:
    """Both sides of P/D for one engine: hooks for prefill requests, K/V acquisition for decode requests,
    the /kv/* routes, and the side channel (`start()` opens it; None for `side_channel` keeps it closed)."""

    def __init__(self, engine: KVEnginePort, metrics: EngineMetrics, *, block_size: int, timeout_s: float,
                 failure_policy: str, api_key: str | None = None, side_channel: tuple[str, int] | None = None,
                 prewarm_bytes: int = 0):
        self.timeout_s = timeout_s
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._side_channel_address = side_channel
        self._prewarm_bytes = prewarm_bytes
        self.side_channel: FrameServer | None = None
        self._client: httpx.AsyncClient | None = None
        self._background: set[asyncio.Task] = set()
        self.prefill = PrefillSide(engine, block_size=block_size, timeout_s=timeout_s, api_key=api_key,
                                   spawn=self._in_background)
        self.decode = DecodeSide(engine, metrics, block_size=block_size, timeout_s=timeout_s,
                                 failure_policy=failure_policy, api_key=api_key, client=lambda: self.client,
                                 spawn=self._in_background)

    @property
    def held(self) -> HeldBlocks:
        """Prefill side: the blocks finished requests hold for a pull."""
        return self.prefill.held

    @property
    def staging(self) -> KVStaging:
        """Decode side: the blocks pushed to this engine, not yet used."""
        return self.decode.staging

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def start(self) -> None:
        """Fault in a frame buffer (`prewarm_bytes`: a P/D engine's largest frame) and listen on the side
        channel, if configured (its connection threads call the engine thread directly)."""
        await asyncio.to_thread(POOL.prewarm, self._prewarm_bytes)
        if self._side_channel_address is not None and self.side_channel is None:
            host, port = self._side_channel_address
            self.side_channel = FrameServer(host, port, self.prefill.export_for_side_channel, self.timeout_s).start()
            log.info("K/V side channel listening on %s:%d", host, self.side_channel.port)

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self.side_channel is not None:
            await asyncio.to_thread(self.side_channel.close)
            self.side_channel = None
        if self._client is not None:
            await self._client.aclose()

    # prefill requests

    def push_sender(self, request_id: str, params: dict | None) -> PushSender | None:
        """A sender for the request's blocks if its params name a decode engine to push to (`push_to`)."""
        push_to = (params or {}).get("push_to")
        if not push_to:
            return None
        if not isinstance(push_to, str) or not push_to.startswith(("http://", "https://")):
            raise InvalidRequest("push_to must be an http(s) base URL", param="kv_transfer_params.push_to")
        return PushSender(asyncio.get_running_loop(), self.client, push_to, request_id, self._auth, self.timeout_s)

    def finished_prefill(self, params: dict, prompt_ids: list[int], prepare: bool = True) -> dict:
        """The final output's kv_transfer_params, registered for a pull, tied to the prompt, and naming the
        side channel when there is one (see PrefillSide.finished)."""
        port = self.side_channel.port if self.side_channel is not None else None
        return self.prefill.finished(params, prompt_ids, prepare, side_channel_port=port)

    # decode requests

    async def acquire(self, params: dict, prompt_ids: list[int]) -> ExternalKV | None:
        """The prompt's K/V from the prefill engine, or None to recompute (policy "recompute")."""
        return await self.decode.acquire(params, prompt_ids)

    def router(self, auth: Callable[..., Any]) -> APIRouter:
        return kv_router(self, auth)

    def _in_background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
