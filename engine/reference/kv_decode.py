"""P/D decode side: getting a prompt's K/V from the prefill engine, or deciding to recompute it.

A `do_remote_prefill` request needs the K/V of its first `prompt_len - 1` tokens (the decode engine recomputes
the last prompt token to get logits). `DecodeSide.acquire` takes what was pushed (`KVStaging`, filled by
`serve_push`) and pulls what is missing: over the side channel when the params name one (`remote_kv_port`,
engine.reference.kv_side_channel), else, or if it cannot connect, over HTTP (`POST <prefill>/kv/pull`). When
nothing needs pulling it tells the prefill engine to free the blocks (`POST <prefill>/kv/release`).

Every received frame is checked (length, checksum, dtype, shape, indices) and the params are checked against
the prompt (`num_tokens`, `prompt_hash`). Any failure, timeout or refused connection is a transfer failure:
with kv_load_failure_policy "recompute" the request computes the prompt itself (correct, slower; counted in
fleet_kv_transfer_failures_total), with "fail" it fails with KVTransferError (502). Never a wrong answer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx
import torch

from engine.errors import InvalidRequest, KVTransferError
from engine.reference.engine_port import KVEnginePort
from engine.reference.kv_prefill import prompt_hash
from engine.reference.kv_side_channel import pull_frame
from engine.reference.kv_wire import MAX_HEADER, POOL, FrameHeader, KVFrame, KVFrameError, decode_frame
from engine.reference.metrics import EngineMetrics

log = logging.getLogger(__name__)


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
    """Prompt K/V received from the prefill engine, for the engine core to load instead of computing."""

    kv: torch.Tensor  # [layers, 2, n_blocks, bs, h, d]: logical blocks first_block .. first_block+n-1
    num_tokens: int  # the prompt tokens it covers, counted from the prompt's start
    first_block: int = 0  # P/D: 0; a tier fetch: the first block the engine's own cache did not hold



class _TransferFailed(Exception):
    """Why a transfer failed; `reason` is the fleet_kv_transfer_failures_total label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason



class DecodeSide:
    """One engine's decode half of P/D: staged pushes, pulls, releases and the failure policy.

    `client()` is the shared HTTP client; `spawn` runs a coroutine in the background (the owner cancels what
    is left on shutdown)."""

    def __init__(self, engine: KVEnginePort, metrics: EngineMetrics, *, block_size: int, timeout_s: float,
                 failure_policy: str, api_key: str | None, client: Callable[[], httpx.AsyncClient],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]):
        self.engine = engine
        self.metrics = metrics
        self.block_size = block_size
        self.timeout_s = timeout_s
        self.failure_policy = failure_policy
        self._api_key = api_key
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client
        self._spawn = spawn
        self.staging = KVStaging(timeout_s, max_blocks=max(1, engine.num_blocks))

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
        if host and _is_port(port):
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
            async with self._client().stream("POST", url, json=body, headers=self._auth) as response:
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
        self._spawn(self._post_quietly(url, {"request_id": request_id}))

    async def _post_quietly(self, url: str, body: dict) -> None:
        try:
            await self._client().post(url, json=body, headers=self._auth)
        except httpx.HTTPError as exc:
            log.info("could not release remote KV at %s: %r", url, exc)


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
    if not host or not _is_port(port):
        raise _TransferFailed("params", "kv_transfer_params lack remote_host / remote_port")
    host = f"[{host}]" if ":" in str(host) else host
    return f"http://{host}:{port}"


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
