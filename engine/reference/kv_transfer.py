"""P/D disaggregation: moving a prompt's K/V from a prefill engine to a decode engine.

The handoff follows vLLM's proxy protocol. The prefill request carries `kv_transfer_params:
{"do_remote_decode": true}` (and max_tokens 1); the prefill engine keeps the prompt's blocks after finishing
and answers with `kv_transfer_params: {"do_remote_prefill": true, "remote_block_ids", "remote_host",
"remote_port", "remote_request_id", "num_tokens", "prompt_hash", "remote_kv_port", ...}`, which the proxy copies
into the decode request. The decode engine needs the K/V of the first `prompt_len - 1` tokens (it recomputes
the last prompt token to get logits) and pulls what it does not have, over the side channel when the params
name one (`remote_kv_port`: raw TCP, engine.reference.kv_wire), else (or if it cannot connect) over HTTP:

    POST /kv/pull {"request_id", "block_ids"}  ->  a frame; the prefill engine then frees the blocks
    POST /kv/release {"request_id"}            ->  free without pulling (everything arrived by push)

Blocks nobody pulls are freed after `kv_transfer_timeout_s` (by the engine core). As the prefill finishes,
the prefill engine builds the frame the decode engine will ask for (`PreparedFrame`: exported while the
blocks stay held, then checksummed, in the background), so a pull usually only sends it; a pull for other
blocks (some were pushed) is exported when it arrives.

Push extension: if the prefill request's kv_transfer_params has `"push_to": "<decode engine base URL>"`, the
prefill engine POSTs each block to `<push_to>/kv/push` as soon as it is computed (the core calls a
KVPushSink on its thread; `PushSender` forwards to an asyncio task). The decode engine stages pushed blocks
by (request_id, logical index) for `kv_transfer_timeout_s` and pulls only what is missing.

The frame (engine.reference.kv_wire) is the same in both directions and on both transports: a small JSON
header, the tensor [layers, 2, n_blocks, block_size, kv_heads, head_dim] in C order, a CRC-32 of it. The
receiver checks length, checksum, dtype, shape and indices; any failure (and any timeout or refused
connection) is a transfer failure: with kv_load_failure_policy "recompute" the decode engine computes the
prompt itself (correct, slower; counted in fleet_kv_transfer_failures_total), with "fail" the request fails
with KVTransferError (502).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import httpx
import torch
from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

from engine.errors import InvalidRequest, KVTransferError
from engine.reference.kv_side_channel import FrameServer, StreamedFrame, pull_frame
from engine.reference.kv_wire import (
    FRAME_MEDIA_TYPE,
    MAX_HEADER,
    POOL,
    FrameBuffer,
    FrameHeader,
    KVFrame,
    KVFrameError,
    KVPullRefused,
    decode_frame,
    empty_kv,
    encode_frame,
)
from engine.reference.metrics import EngineMetrics

__all__ = ["HeldBlocks", "KVFrame", "KVFrameError", "KVStaging", "KVTransfer", "PushSender", "decode_frame",
           "encode_frame", "prompt_hash"]

log = logging.getLogger(__name__)

_HELD_TTL_FRACTION = 0.9
_MAX_PREPARED_BYTES = 512 << 20  # frames built ahead of their pull, in all (beyond: exported when pulled)


# --- prefill side -------------------------------------------------------------------------------------


@dataclass
class PreparedFrame:
    """A pull's frame built ahead of the pull, as the prefill finishes: the blocks decode will ask for, exported
    (still held) and then checksummed in the background; `future` resolves to the FrameBuffer once its payload
    is in (it may still be sealing: see FrameBuffer.sealed)."""

    block_ids: list[int]
    nbytes: int
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class _Held:
    block_ids: list[int]
    expires: float
    prepared: PreparedFrame | None = None


class HeldBlocks:
    """Prefill side: which physical blocks each finished P/D request holds for a pull (and the frame prepared
    for it, if any), until they expire. Thread-safe: the event loop and the side channel's connection threads
    both claim pulls."""

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()

    def add(self, request_id: str, block_ids: list[int]) -> None:
        with self._lock:
            self._prune()
            self._held[request_id] = _Held(list(block_ids), time.monotonic() + self.ttl_s)

    def attach(self, request_id: str, prepared: PreparedFrame) -> bool:
        with self._lock:
            held = self._held.get(request_id)
            if held is not None:
                held.prepared = prepared
            return held is not None

    def logical_indices(self, request_id: str, block_ids: list[int]) -> list[int]:
        """Positions of block_ids in the request's held blocks; KeyError if the request holds none of them."""
        with self._lock:
            return self._logical_indices(request_id, block_ids)

    def claim(self, request_id: str, block_ids: list[int]) -> tuple[list[int], PreparedFrame | None]:
        """logical_indices and the prepared frame, and stop holding the request (it is about to be exported),
        atomically."""
        with self._lock:
            indices = self._logical_indices(request_id, block_ids)
            return indices, self._held.pop(request_id).prepared

    def pop(self, request_id: str) -> bool:
        with self._lock:
            return self._held.pop(request_id, None) is not None

    def prepared_bytes(self) -> int:
        with self._lock:
            self._prune()
            return sum(h.prepared.nbytes for h in self._held.values() if h.prepared is not None)

    def __len__(self) -> int:
        with self._lock:
            self._prune()
            return len(self._held)

    def _logical_indices(self, request_id: str, block_ids: list[int]) -> list[int]:
        self._prune()
        position = {b: i for i, b in enumerate(self._held[request_id].block_ids)}
        bad = [b for b in block_ids if b not in position]
        if bad:
            raise InvalidRequest(f"blocks {bad[:8]} are not held for request {request_id}", param="block_ids")
        return [position[b] for b in block_ids]

    def _prune(self) -> None:
        now = time.monotonic()
        for rid in [rid for rid, held in self._held.items() if held.expires <= now]:
            del self._held[rid]


class PushSender:
    """A KVPushSink: the engine thread calls push()/done(); an asyncio task POSTs the blocks to the decode engine.

    Blocks that queued up while a POST was in flight go together in the next frame. After the first failed
    POST it stops pushing: the decode engine pulls what it lacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient, push_to: str, request_id: str,
                 headers: dict[str, str], timeout_s: float):
        self._loop = loop
        self._client = client
        self._url = push_to.rstrip("/") + "/kv/push"
        self._request_id = request_id
        self._headers = {**headers, "content-type": FRAME_MEDIA_TYPE}
        self._timeout_s = timeout_s
        self._queue: asyncio.Queue[tuple[int, torch.Tensor] | None] = asyncio.Queue()
        self.pushed: list[int] = []
        self.failed = False
        self._task = loop.create_task(self._run())

    # engine thread
    def push(self, logical_index: int, kv: torch.Tensor) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (logical_index, kv))

    def done(self, num_tokens: int) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, None)

    # event loop
    async def finish(self, timeout_s: float) -> list[int]:
        """Wait until every block handed over so far is sent (or given up on); the indices that arrived."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except asyncio.TimeoutError:
            self.cancel()
        return list(self.pushed)

    def cancel(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        finished = False
        while not finished:
            batch, finished = await self._next_batch()
            if batch and not self.failed:
                await self._send(batch)

    async def _next_batch(self) -> tuple[list[tuple[int, torch.Tensor]], bool]:
        item = await self._queue.get()
        if item is None:
            return [], True
        batch = [item]
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    async def _send(self, batch: list[tuple[int, torch.Tensor]]) -> None:
        indices = [i for i, _ in batch]
        try:
            kv = torch.cat([kv for _, kv in batch], dim=2)  # [layers, 2, n, bs, h, d]
            frame = await asyncio.to_thread(lambda: bytes(encode_frame(self._request_id, indices, kv)))
            response = await self._client.post(self._url, content=frame, headers=self._headers, timeout=self._timeout_s)
            response.raise_for_status()
            self.pushed += indices
        except Exception as exc:  # the decode engine will pull these instead
            self.failed = True
            log.warning("KV push of %s blocks %s to %s failed: %s", self._request_id, indices, self._url, exc)


# --- decode side --------------------------------------------------------------------------------------


class KVStaging:
    """Decode side: pushed blocks by request id and logical index, kept for `ttl_s` after the request's last
    push, at most `max_blocks` in all (the requests pushed to longest ago go first)."""

    def __init__(self, ttl_s: float, max_blocks: int):
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self._requests: OrderedDict[str, tuple[dict[int, torch.Tensor], float]] = OrderedDict()
        self._num_blocks = 0

    def put(self, frame: KVFrame) -> None:
        self._prune()
        blocks, _ = self._requests.pop(frame.request_id, ({}, 0.0))
        for position, index in enumerate(frame.block_indices):
            self._num_blocks += index not in blocks
            blocks[index] = frame.block(position).clone()
        self._requests[frame.request_id] = (blocks, time.monotonic() + self.ttl_s)
        while self._num_blocks > self.max_blocks:
            self._drop(next(iter(self._requests)))

    def take(self, request_id: str, indices: range) -> dict[int, torch.Tensor]:
        """The staged blocks among `indices`; the request's other staged blocks are dropped (not needed)."""
        self._prune()
        if request_id not in self._requests:
            return {}
        blocks = self._drop(request_id)
        return {i: blocks[i] for i in indices if i in blocks}

    def __len__(self) -> int:
        """Staged blocks."""
        self._prune()
        return self._num_blocks

    def _drop(self, request_id: str) -> dict[int, torch.Tensor]:
        blocks, _ = self._requests.pop(request_id)
        self._num_blocks -= len(blocks)
        return blocks

    def _prune(self) -> None:
        now = time.monotonic()
        for rid in [rid for rid, (_, expires) in self._requests.items() if expires <= now]:
            self._drop(rid)


@dataclass
class ExternalKV:
    kv: torch.Tensor  # [layers, 2, n_blocks, bs, h, d], logical blocks 0..n-1 of the prompt
    num_tokens: int


def prompt_hash(token_ids: list[int]) -> str:
    """Ties a transfer to its prompt: the decode engine refuses K/V computed for other tokens."""
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:32]


class _TransferFailed(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# --- the per-engine hub -------------------------------------------------------------------------------


class PullRequest(BaseModel):
    request_id: str
    block_ids: list[int]


class ReleaseRequest(BaseModel):
    request_id: str


class KVTransfer:
    """Both sides of P/D for one engine: hooks for prefill requests, K/V acquisition for decode requests,
    the /kv/* routes, and the side channel (`start()` opens it; None for `side_channel` keeps it closed)."""

    def __init__(self, engine: Any, metrics: EngineMetrics, *, block_size: int, timeout_s: float,
                 failure_policy: str, api_key: str | None = None, side_channel: tuple[str, int] | None = None,
                 prewarm_bytes: int = 0):
        self.engine = engine
        self.metrics = metrics
        self.block_size = block_size
        self.timeout_s = timeout_s
        self.failure_policy = failure_policy
        self._api_key = api_key
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # Forget held blocks a little before the engine core frees them (its clock starts when the request
        # finishes, ours when the response is built): a pull must never export blocks already reused.
        self.held = HeldBlocks(timeout_s * _HELD_TTL_FRACTION)
        self.staging = KVStaging(timeout_s, max_blocks=max(1, engine.num_blocks))
        self._side_channel_address = side_channel
        self._prewarm_bytes = prewarm_bytes
        self.side_channel: FrameServer | None = None
        self._client: httpx.AsyncClient | None = None
        self._background: set[asyncio.Task] = set()

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
            self.side_channel = FrameServer(host, port, self._export_for_side_channel, self.timeout_s).start()
            log.info("K/V side channel listening on %s:%d", host, self.side_channel.port)

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self.side_channel is not None:
            await asyncio.to_thread(self.side_channel.close)
            self.side_channel = None
        if self._client is not None:
            await self._client.aclose()

    # prefill side

    def push_sender(self, request_id: str, params: dict | None) -> PushSender | None:
        push_to = (params or {}).get("push_to")
        if not push_to:
            return None
        if not isinstance(push_to, str) or not push_to.startswith(("http://", "https://")):
            raise InvalidRequest("push_to must be an http(s) base URL", param="kv_transfer_params.push_to")
        return PushSender(asyncio.get_running_loop(), self.client, push_to, request_id, self._auth, self.timeout_s)

    def finished_prefill(self, params: dict, prompt_ids: list[int], prepare: bool = True) -> dict:
        """The final output's kv_transfer_params, registered for a pull, tied to the prompt, and naming the
        side channel when there is one. With `prepare` (no push) the frame decode will pull is built at once,
        in the background, while the blocks stay held: by the time the pull arrives it is usually ready, and
        the pull only sends it."""
        request_id, block_ids = params["remote_request_id"], params["remote_block_ids"]
        self.held.add(request_id, block_ids)
        if prepare:
            self._prepare(request_id, block_ids[: math.ceil((len(prompt_ids) - 1) / self.block_size)])
        extra = {"remote_kv_port": self.side_channel.port} if self.side_channel is not None else {}
        return {**params, "prompt_hash": prompt_hash(prompt_ids), **extra}

    def _prepare(self, request_id: str, block_ids: list[int]) -> None:
        header = self._header(request_id, list(range(len(block_ids))))  # the first blocks: logical 0..n-1
        if not block_ids or self.held.prepared_bytes() + header.nbytes > _MAX_PREPARED_BYTES:
            return
        prepared = PreparedFrame(block_ids, header.nbytes)
        if self.held.attach(request_id, prepared):
            self._in_background(self._build(header, prepared))

    async def _build(self, header: FrameHeader, prepared: PreparedFrame) -> None:
        if not prepared.future.set_running_or_notify_cancel():
            return
        try:
            frame = FrameBuffer(header, self.engine.kv_dtype)
            await self.engine.pull_held(header.request_id, prepared.block_ids, out=frame.payload, release=False)
        except BaseException as exc:  # not held any more (pulled or released first), or shutting down
            prepared.future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        prepared.future.set_result(frame)  # a pull may start sending the payload now
        await asyncio.to_thread(frame.seal)

    async def serve_pull(self, body: PullRequest) -> memoryview:
        """The HTTP pull: the prepared frame, or the blocks exported now straight into a frame buffer."""
        header, prepared = self._claim(body.request_id, body.block_ids)
        if prepared is not None:
            try:
                frame = await asyncio.wait_for(asyncio.wrap_future(prepared.future), self.timeout_s)
            except Exception as exc:
                log.info("prepared K/V frame of %s failed (%r); exporting now", body.request_id, exc)
            else:
                await self.engine.release_held(body.request_id)
                return await asyncio.wait_for(asyncio.wrap_future(frame.sealed), self.timeout_s)
        frame = FrameBuffer(header, self.engine.kv_dtype)
        await self.engine.pull_held(body.request_id, body.block_ids, out=frame.payload)  # exports and releases
        return await asyncio.to_thread(frame.seal)

    def _export_for_side_channel(self, request: dict) -> FrameBuffer | StreamedFrame:
        """A side-channel connection thread's pull: the prepared frame, or the blocks exported now by the
        engine thread (called directly) and checksummed as they are sent."""
        if self._api_key and not hmac.compare_digest(str(request.get("api_key", "")), self._api_key):
            raise KVPullRefused("unauthorized: wrong or missing api_key")
        request_id, block_ids = request.get("request_id"), request.get("block_ids")
        if not isinstance(request_id, str) or not isinstance(block_ids, list) or \
                not all(isinstance(b, int) for b in block_ids):
            raise KVPullRefused("a pull needs request_id (string) and block_ids (integers)")
        header, prepared = self._claim(request_id, block_ids)
        if prepared is not None:
            try:
                frame = prepared.future.result(self.timeout_s)
            except Exception as exc:
                log.info("prepared K/V frame of %s failed (%r); exporting now", request_id, exc)
            else:
                self.engine.submit(lambda engine: engine.release_held(request_id))
                return frame
        kv = empty_kv(self.engine.kv_dtype, header.tensor_shape)
        self.engine.submit(lambda engine: engine.pull_held(request_id, block_ids, kv)).result(self.timeout_s)
        return StreamedFrame(header, kv)

    def _claim(self, request_id: str, block_ids: list[int]) -> tuple[FrameHeader, PreparedFrame | None]:
        """Stop tracking a held request about to be exported (InvalidRequest if it holds none of block_ids);
        the frame header for those blocks, and the prepared frame if it is exactly those blocks."""
        try:
            indices, prepared = self.held.claim(request_id, block_ids)
        except KeyError:
            message = f"no K/V held for request {request_id} (expired or pulled)"
            raise InvalidRequest(message, param="request_id") from None
        if prepared is not None and prepared.block_ids != list(block_ids):
            prepared = None  # decode asks for other blocks (some were pushed): export those now
        return self._header(request_id, indices), prepared

    def _header(self, request_id: str, indices: list[int]) -> FrameHeader:
        return FrameHeader.for_blocks(request_id, indices, self.engine.kv_dtype, self.engine.kv_block_shape)

    async def release(self, request_id: str) -> bool:
        self.held.pop(request_id)
        return bool(await self.engine.release_held(request_id))

    # decode side

    async def _decode(self, data: bytes | memoryview) -> KVFrame:
        """Parse and verify a frame against this engine's K/V dtype and block shape (off the event loop)."""
        return await asyncio.to_thread(decode_frame, data, self.engine.kv_dtype, self.engine.kv_block_shape)

    async def serve_push(self, data: bytes) -> list[int]:
        try:
            frame = await self._decode(data)
        except KVFrameError as exc:
            self.metrics.record_kv_transfer_failure(f"push_{exc.reason}")
            raise InvalidRequest(f"rejected K/V push: {exc}", param="body") from None
        self.staging.put(frame)
        return frame.block_indices

    async def acquire(self, params: dict, prompt_ids: list[int]) -> ExternalKV | None:
        """The prompt's K/V from the prefill engine, or None to recompute (policy "recompute")."""
        needed = len(prompt_ids) - 1
        if needed <= 0:  # a one-token prompt: decode computes it all, the prefill's blocks are not needed
            self._release_remote(params)
            return None
        start = time.monotonic()
        try:
            kv, mode, nbytes = await self._fetch(params, prompt_ids, needed)
        except _TransferFailed as exc:
            return self._failed(params, exc)
        self.metrics.record_kv_transfer(mode, nbytes, time.monotonic() - start)
        return ExternalKV(kv, needed)

    def _failed(self, params: dict, exc: _TransferFailed) -> None:
        self.metrics.record_kv_transfer_failure(exc.reason)
        self._release_remote(params)
        if self.failure_policy == "fail":
            raise KVTransferError(f"KV transfer from the prefill engine failed: {exc}", param="kv_transfer_params")
        log.warning("KV transfer failed (%s: %s); recomputing the prompt", exc.reason, exc)
        return None

    async def _fetch(self, params: dict, prompt_ids: list[int], needed: int) -> tuple[torch.Tensor, str, int]:
        request_id, remote_ids = _check_params(params, prompt_ids)
        n = math.ceil(needed / self.block_size)
        if len(remote_ids) < n:
            raise _TransferFailed("params", f"{len(remote_ids)} remote blocks for {needed} tokens")
        blocks = self.staging.take(request_id, range(n))
        missing = [i for i in range(n) if i not in blocks]
        if not missing:
            self._release_remote(params)
            kv = torch.cat([blocks[i] for i in range(n)], dim=2)
        else:
            pulled = await self._pull(params, request_id, missing, [remote_ids[i] for i in missing])
            if len(missing) == n:
                kv = pulled.kv  # the whole prompt in one frame, in order: used as received, no copy
            else:
                blocks.update((index, pulled.block(position)) for position, index in enumerate(missing))
                kv = torch.cat([blocks[i] for i in range(n)], dim=2)
        mode = "pull" if len(missing) == n else ("push+pull" if missing else "push")
        return kv, mode, kv.numel() * kv.element_size()

    async def _pull(self, params: dict, request_id: str, indices: list[int], block_ids: list[int]) -> KVFrame:
        """The blocks over the side channel if the prefill engine named one and it accepts a connection,
        else over HTTP. Either way the frame must be exactly the blocks asked for."""
        expect = FrameHeader.for_blocks(request_id, indices, self.engine.kv_dtype, self.engine.kv_block_shape)
        host, port = params.get("remote_host"), params.get("remote_kv_port")
        if host and isinstance(port, int) and not isinstance(port, bool):
            request = {"request_id": request_id, "block_ids": block_ids}
            if self._api_key:
                request["api_key"] = self._api_key
            try:
                return await asyncio.to_thread(pull_frame, str(host), port, request, expect, self.engine.kv_dtype,
                                               self.timeout_s)
            except KVFrameError as exc:
                raise _TransferFailed(exc.reason, f"pull from {host}:{port}: {exc}") from None
            except OSError as exc:  # no connection, so nothing was exported: the blocks are still held
                log.info("K/V side channel %s:%s unreachable (%r); pulling over HTTP", host, port, exc)
        return await self._pull_http(params, block_ids, expect)

    async def _pull_http(self, params: dict, block_ids: list[int], expect: FrameHeader) -> KVFrame:
        url = f"{_remote_base(params)}/kv/pull"
        body = {"request_id": expect.request_id, "block_ids": block_ids}
        try:
            async with self.client.stream("POST", url, json=body, headers=self._auth) as response:
                if response.status_code != 200:
                    raise _TransferFailed("status", f"pull from {url}: HTTP {response.status_code}")
                data = await _read_frame_body(response, expect.nbytes + MAX_HEADER + 64)
        except httpx.HTTPError as exc:
            raise _TransferFailed(_http_failure_reason(exc), f"pull from {url}: {exc!r}") from None
        except KVFrameError as exc:
            raise _TransferFailed(exc.reason, f"pull from {url}: {exc}") from None
        try:
            frame = await self._decode(data)
        except KVFrameError as exc:
            raise _TransferFailed(exc.reason, f"pull from {url}: {exc}") from None
        if frame.request_id != expect.request_id or frame.block_indices != expect.block_indices:
            raise _TransferFailed("indices", f"pull from {url} returned blocks {frame.block_indices}, "
                                             f"wanted {expect.block_indices}")
        return frame

    def _release_remote(self, params: dict) -> None:
        """Tell the prefill engine to free the blocks (fire and forget: they expire anyway)."""
        try:
            url, request_id = f"{_remote_base(params)}/kv/release", str(params["remote_request_id"])
        except (KeyError, _TransferFailed):
            return
        self._in_background(self._post_quietly(url, {"request_id": request_id}))

    def _in_background(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _post_quietly(self, url: str, body: dict) -> None:
        try:
            await self.client.post(url, json=body, headers=self._auth)
        except httpx.HTTPError as exc:
            log.info("could not release remote KV at %s: %r", url, exc)

    # routes

    def router(self, auth: Any) -> APIRouter:
        router = APIRouter(dependencies=[Depends(auth)])

        @router.post("/kv/pull")
        async def kv_pull(body: PullRequest) -> Response:
            return Response(await self.serve_pull(body), media_type=FRAME_MEDIA_TYPE)

        @router.post("/kv/push")
        async def kv_push(request: Request) -> dict:
            return {"staged": await self.serve_push(await request.body())}

        @router.post("/kv/release")
        async def kv_release(body: ReleaseRequest) -> dict:
            return {"released": await self.release(body.request_id)}

        return router


async def _read_frame_body(response: httpx.Response, limit: int) -> memoryview | bytes:
    """The body of a /kv/pull response: into one preallocated buffer when the length is announced (so the
    frame's tensor can view it), refusing bodies larger than the frame asked for could be."""
    length = response.headers.get("content-length")
    if length is None or not length.isdigit() or response.headers.get("content-encoding", "identity") != "identity":
        return await response.aread()
    if int(length) > limit:
        raise KVFrameError("shape", f"a {length}-byte frame for at most {limit} bytes of blocks")
    buffer = memoryview(POOL.take(int(length)))
    got = 0
    async for chunk in response.aiter_raw():
        if got + len(chunk) > len(buffer):
            raise KVFrameError("truncated", f"body longer than its content-length {length}")
        buffer[got : got + len(chunk)] = chunk
        got += len(chunk)
    return buffer[:got]


def _check_params(params: dict, prompt_ids: list[int]) -> tuple[str, list[int]]:
    request_id, remote_ids = params.get("remote_request_id"), params.get("remote_block_ids")
    ids_ok = isinstance(remote_ids, list) and all(isinstance(b, int) for b in remote_ids)
    if not isinstance(request_id, str) or not ids_ok:
        raise _TransferFailed("params", "kv_transfer_params lack remote_request_id / remote_block_ids")
    if params.get("num_tokens") not in (None, len(prompt_ids)):
        message = f"prefill computed {params['num_tokens']} tokens, this prompt has {len(prompt_ids)}"
        raise _TransferFailed("prompt", message)
    if params.get("prompt_hash") not in (None, prompt_hash(prompt_ids)):
        raise _TransferFailed("prompt", "the prefill engine computed a different prompt")
    return request_id, remote_ids


def _http_failure_reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "http"


def _remote_base(params: dict) -> str:
    host, port = params.get("remote_host"), params.get("remote_port")
    if not host or not isinstance(port, int):
        raise _TransferFailed("params", "kv_transfer_params lack remote_host / remote_port")
    host = f"[{host}]" if ":" in str(host) else host
    return f"http://{host}:{port}"
