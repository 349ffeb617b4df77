"""P/D prefill side: holding a finished prompt's K/V blocks for the decode engine, and serving its pull.

When a `do_remote_decode` request finishes, the engine core keeps its blocks; `PrefillSide.finished` records
them (`HeldBlocks`), ties the advertised kv_transfer_params to the prompt (`prompt_hash`) and, unless the
blocks were pushed, builds the frame the decode engine will ask for ahead of the pull (`PreparedFrame`:
exported while the blocks stay held, then checksummed, in the background), so a pull usually only sends it.
A pull for other blocks (some were pushed) is exported when it arrives. A pull comes over HTTP
(`serve_pull`) or the side channel (`export_for_side_channel`, on a connection thread); either way the
request stops being held as the export starts, so two pulls never export the same blocks.

Invariant: blocks are forgotten here a little before the engine core frees them (`HELD_TTL_FRACTION` of
kv_transfer_timeout_s), so a pull never exports blocks already reused.
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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from engine.errors import InvalidRequest
from engine.reference.engine_port import KVEnginePort
from engine.reference.kv_side_channel import StreamedFrame
from engine.reference.kv_wire import FrameBuffer, FrameHeader, KVPullRefused, empty_kv

log = logging.getLogger(__name__)

# Forget held blocks a little before the engine core frees them (its clock starts when the request finishes,
# ours when the response is built): a pull must never export blocks already reused.
HELD_TTL_FRACTION = 0.9
_MAX_PREPARED_BYTES = 512 << 20  # frames built ahead of their pull, in all (beyond: exported when pulled)


def prompt_hash(token_ids: list[int]) -> str:
    """Ties a transfer to its prompt: the decode engine refuses K/V computed for other tokens."""
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:32]



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


class PrefillSide:
    """One engine's prefill half of P/D: held blocks, prepared frames, pulls and releases.

    `spawn` runs a coroutine in the background (the owner cancels what is left on shutdown)."""

    def __init__(self, engine: KVEnginePort, *, block_size: int, timeout_s: float, api_key: str | None,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]):
        self.engine = engine
        self.block_size = block_size
        self.timeout_s = timeout_s
        self._api_key = api_key
        self._spawn = spawn
        self.held = HeldBlocks(timeout_s * HELD_TTL_FRACTION)

    def finished(self, params: dict, prompt_ids: list[int], prepare: bool, side_channel_port: int | None) -> dict:
        """The final output's kv_transfer_params, registered for a pull, tied to the prompt, and naming the
        side channel when there is one. With `prepare` (no push) the frame decode will pull is built at once,
        in the background, while the blocks stay held: by the time the pull arrives it is usually ready, and
        the pull only sends it."""
        request_id, block_ids = params["remote_request_id"], params["remote_block_ids"]
        self.held.add(request_id, block_ids)
        if prepare:
            self._prepare(request_id, block_ids[: math.ceil((len(prompt_ids) - 1) / self.block_size)])
        extra = {"remote_kv_port": side_channel_port} if side_channel_port is not None else {}
        return {**params, "prompt_hash": prompt_hash(prompt_ids), **extra}

    def _prepare(self, request_id: str, block_ids: list[int]) -> None:
        header = self._header(request_id, list(range(len(block_ids))))  # the first blocks: logical 0..n-1
        if not block_ids or self.held.prepared_bytes() + header.nbytes > _MAX_PREPARED_BYTES:
            return
        prepared = PreparedFrame(block_ids, header.nbytes)
        if self.held.attach(request_id, prepared):
            self._spawn(self._build(header, prepared))

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

    async def serve_pull(self, request_id: str, block_ids: list[int]) -> memoryview:
        """The HTTP pull: the prepared frame, or the blocks exported now straight into a frame buffer."""
        header, prepared = self._claim(request_id, block_ids)
        if prepared is not None:
            try:
                frame = await asyncio.wait_for(asyncio.wrap_future(prepared.future), self.timeout_s)
            except Exception as exc:
                log.info("prepared K/V frame of %s failed (%r); exporting now", request_id, exc)
            else:
                await self.engine.release_held(request_id)
                return await asyncio.wait_for(asyncio.wrap_future(frame.sealed), self.timeout_s)
        frame = FrameBuffer(header, self.engine.kv_dtype)
        await self.engine.pull_held(request_id, block_ids, out=frame.payload)  # exports and releases
        return await asyncio.to_thread(frame.seal)

    def export_for_side_channel(self, request: dict) -> FrameBuffer | StreamedFrame:
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
