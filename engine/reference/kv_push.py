"""P/D push extension, prefill side: each K/V block POSTed to the decode engine as soon as it is computed.

When the prefill request's kv_transfer_params name `"push_to": "<decode engine base URL>"`, the engine core
calls a `PushSender` (a kv_sinks.KVPushSink) on its thread for every block it completes; the sender hands them to an
asyncio task that POSTs frames (engine.reference.kv_wire) to `<push_to>/kv/push`. A failed push is not an
error: the decode engine pulls whatever did not arrive.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import torch

from engine.reference.kv_wire import FRAME_MEDIA_TYPE, encode_frame

log = logging.getLogger(__name__)


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
