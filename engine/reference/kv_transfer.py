"""P/D disaggregation: moving a prompt's K/V from a prefill engine to a decode engine over HTTP.

The handoff follows vLLM's proxy protocol. The prefill request carries `kv_transfer_params:
{"do_remote_decode": true}` (and max_tokens 1); the prefill engine keeps the prompt's blocks after finishing
and answers with `kv_transfer_params: {"do_remote_prefill": true, "remote_block_ids", "remote_host",
"remote_port", "remote_request_id", "num_tokens", "prompt_hash", ...}`, which the proxy copies into the
decode request. The decode engine needs the K/V of the first `prompt_len - 1` tokens (it recomputes the last
prompt token to get logits) and pulls what it does not have:

    POST /kv/pull {"request_id", "block_ids"}  ->  a frame (below); the prefill engine then frees the blocks
    POST /kv/release {"request_id"}            ->  free without pulling (everything arrived by push)

Blocks nobody pulls are freed after `kv_transfer_timeout_s` (by the engine core).

Push extension: if the prefill request's kv_transfer_params has `"push_to": "<decode engine base URL>"`, the
prefill engine POSTs each block to `<push_to>/kv/push` as soon as it is computed (the core calls a
KVPushSink on its thread; `PushSender` forwards to an asyncio task). The decode engine stages pushed blocks
by (request_id, logical index) for `kv_transfer_timeout_s` and pulls only what is missing.

Frame (both directions): `!I` header length, a UTF-8 JSON header, then the raw tensor bytes:
    {"version": 1, "request_id", "block_indices": [logical indices], "dtype": "float32",
     "block_shape": [layers, 2, block_size, kv_heads, head_dim], "nbytes", "sha256": hex of the payload}
The payload is the tensor [layers, 2, n_blocks, block_size, kv_heads, head_dim] in C order (the engine's
export layout). The receiver checks length, checksum, dtype, shape and indices; any failure (and any
timeout or refused connection) is a transfer failure: with kv_load_failure_policy "recompute" the decode
engine computes the prompt itself (correct, slower; counted in fleet_kv_transfer_failures_total), with
"fail" the request fails with KVTransferError (502).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import httpx
import torch
from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

from engine.errors import InvalidRequest, KVTransferError
from engine.reference.metrics import EngineMetrics

log = logging.getLogger(__name__)

FRAME_VERSION = 1
FRAME_MEDIA_TYPE = "application/x-fleet-kv"
_LEN = struct.Struct("!I")
_MAX_HEADER = 1 << 20
_HELD_TTL_FRACTION = 0.9


# --- the frame ----------------------------------------------------------------------------------------


class KVFrameError(Exception):
    """A frame that cannot be trusted; `reason` is the metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode_frame(request_id: str, block_indices: list[int], kv: torch.Tensor) -> bytes:
    """kv: [layers, 2, n, bs, h, d] with n == len(block_indices)."""
    if kv.shape[2] != len(block_indices):
        raise ValueError(f"{kv.shape[2]} blocks for {len(block_indices)} indices")
    payload = kv.contiguous().view(torch.uint8).numpy().tobytes()
    header = {
        "version": FRAME_VERSION,
        "request_id": request_id,
        "block_indices": list(block_indices),
        "dtype": dtype_name(kv.dtype),
        "block_shape": [kv.shape[0], kv.shape[1], *kv.shape[3:]],
        "nbytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    raw = json.dumps(header).encode()
    return _LEN.pack(len(raw)) + raw + payload


@dataclass
class KVFrame:
    request_id: str
    block_indices: list[int]
    kv: torch.Tensor  # [layers, 2, n, bs, h, d]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def block(self, position: int) -> torch.Tensor:
        return self.kv[:, :, position : position + 1]


def decode_frame(data: bytes, dtype: torch.dtype, block_shape: tuple[int, ...]) -> KVFrame:
    """Parse and verify a frame against the receiver's K/V dtype and per-block shape; KVFrameError if bad."""
    header, payload = _split(data)
    _check_header(header, payload, dtype, block_shape)
    n = len(header["block_indices"])
    layers, two, *rest = block_shape
    kv = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(layers, two, n, *rest)
    return KVFrame(str(header["request_id"]), [int(i) for i in header["block_indices"]], kv)


def _split(data: bytes) -> tuple[dict, bytes]:
    if len(data) < _LEN.size:
        raise KVFrameError("truncated", f"frame of {len(data)} bytes has no header")
    (length,) = _LEN.unpack_from(data)
    if length > _MAX_HEADER or _LEN.size + length > len(data):
        raise KVFrameError("truncated", f"header of {length} bytes does not fit a {len(data)}-byte frame")
    try:
        header = json.loads(data[_LEN.size : _LEN.size + length])
    except ValueError as exc:
        raise KVFrameError("header", f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise KVFrameError("header", "header is not an object")
    return header, data[_LEN.size + length :]


def _check_header(header: dict, payload: bytes, dtype: torch.dtype, block_shape: tuple[int, ...]) -> None:
    required = ("version", "request_id", "block_indices", "dtype", "block_shape", "nbytes", "sha256")
    missing = [k for k in required if k not in header]
    if missing or header["version"] != FRAME_VERSION or not isinstance(header["block_indices"], list):
        raise KVFrameError("header", f"bad header (missing {missing}, version {header.get('version')})")
    if header["nbytes"] != len(payload):
        raise KVFrameError("truncated", f"payload has {len(payload)} bytes, header says {header['nbytes']}")
    if hashlib.sha256(payload).hexdigest() != header["sha256"]:
        raise KVFrameError("checksum", "payload checksum mismatch")
    if header["dtype"] != dtype_name(dtype):
        raise KVFrameError("dtype", f"K/V dtype {header['dtype']} does not match {dtype_name(dtype)}")
    if tuple(header["block_shape"]) != tuple(block_shape):
        raise KVFrameError("shape", f"block shape {header['block_shape']} does not match {list(block_shape)}")
    expected = len(header["block_indices"]) * math.prod(block_shape) * dtype.itemsize
    if expected != len(payload):
        raise KVFrameError("shape", f"{len(payload)} bytes for {len(header['block_indices'])} blocks")


# --- prefill side -------------------------------------------------------------------------------------


class HeldBlocks:
    """Prefill side: which physical blocks each finished P/D request holds for a pull, until they expire."""

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._held: dict[str, tuple[list[int], float]] = {}

    def add(self, request_id: str, block_ids: list[int]) -> None:
        self._prune()
        self._held[request_id] = (list(block_ids), time.monotonic() + self.ttl_s)

    def logical_indices(self, request_id: str, block_ids: list[int]) -> list[int]:
        """Positions of block_ids in the request's held blocks; KeyError if the request holds none of them."""
        self._prune()
        held, _ = self._held[request_id]
        position = {b: i for i, b in enumerate(held)}
        bad = [b for b in block_ids if b not in position]
        if bad:
            raise InvalidRequest(f"blocks {bad[:8]} are not held for request {request_id}", param="block_ids")
        return [position[b] for b in block_ids]

    def pop(self, request_id: str) -> bool:
        return self._held.pop(request_id, None) is not None

    def __len__(self) -> int:
        self._prune()
        return len(self._held)

    def _prune(self) -> None:
        now = time.monotonic()
        for rid in [rid for rid, (_, expires) in self._held.items() if expires <= now]:
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
            frame = await asyncio.to_thread(encode_frame, self._request_id, indices, kv)
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
    and the /kv/* routes."""

    def __init__(self, engine: Any, metrics: EngineMetrics, *, block_size: int, timeout_s: float,
                 failure_policy: str, api_key: str | None = None):
        self.engine = engine
        self.metrics = metrics
        self.block_size = block_size
        self.timeout_s = timeout_s
        self.failure_policy = failure_policy
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # Forget held blocks a little before the engine core frees them (its clock starts when the request
        # finishes, ours when the response is built): a pull must never export blocks already reused.
        self.held = HeldBlocks(timeout_s * _HELD_TTL_FRACTION)
        self.staging = KVStaging(timeout_s, max_blocks=max(1, engine.num_blocks))
        self._client: httpx.AsyncClient | None = None
        self._background: set[asyncio.Task] = set()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
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

    def finished_prefill(self, params: dict, prompt_ids: list[int]) -> dict:
        """The final output's kv_transfer_params, registered for a pull and tied to the prompt."""
        self.held.add(params["remote_request_id"], params["remote_block_ids"])
        return {**params, "prompt_hash": prompt_hash(prompt_ids)}

    async def serve_pull(self, body: PullRequest) -> bytes:
        try:
            indices = self.held.logical_indices(body.request_id, body.block_ids)
        except KeyError:
            message = f"no K/V held for request {body.request_id} (expired or pulled)"
            raise InvalidRequest(message, param="request_id") from None
        self.held.pop(body.request_id)
        kv = await self.engine.pull_held(body.request_id, body.block_ids)  # exports and releases atomically
        return await asyncio.to_thread(encode_frame, body.request_id, indices, kv)

    async def release(self, request_id: str) -> bool:
        self.held.pop(request_id)
        return bool(await self.engine.release_held(request_id))

    # decode side

    async def _decode(self, data: bytes) -> KVFrame:
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
        if missing:
            blocks.update(await self._pull(params, request_id, missing, [remote_ids[i] for i in missing]))
        else:
            self._release_remote(params)
        kv = torch.cat([blocks[i] for i in range(n)], dim=2)
        mode = "pull" if len(missing) == n else ("push+pull" if missing else "push")
        return kv, mode, kv.numel() * kv.element_size()

    async def _pull(self, params: dict, request_id: str, indices: list[int],
                    block_ids: list[int]) -> dict[int, torch.Tensor]:
        url = f"{_remote_base(params)}/kv/pull"
        body = {"request_id": request_id, "block_ids": block_ids}
        try:
            response = await self.client.post(url, json=body, headers=self._auth)
        except httpx.HTTPError as exc:
            raise _TransferFailed(_http_failure_reason(exc), f"pull from {url}: {exc!r}") from None
        if response.status_code != 200:
            raise _TransferFailed("status", f"pull from {url}: HTTP {response.status_code}")
        try:
            frame = await self._decode(response.content)
        except KVFrameError as exc:
            raise _TransferFailed(exc.reason, f"pull from {url}: {exc}") from None
        if frame.request_id != request_id or frame.block_indices != indices:
            raise _TransferFailed("indices", f"pull from {url} returned blocks {frame.block_indices}, wanted {indices}")
        return {index: frame.block(position) for position, index in enumerate(indices)}

    def _release_remote(self, params: dict) -> None:
        """Tell the prefill engine to free the blocks (fire and forget: they expire anyway)."""
        try:
            url, request_id = f"{_remote_base(params)}/kv/release", str(params["remote_request_id"])
        except (KeyError, _TransferFailed):
            return
        task = asyncio.get_running_loop().create_task(self._post_quietly(url, {"request_id": request_id}))
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
