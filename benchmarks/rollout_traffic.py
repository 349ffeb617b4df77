"""Steady client traffic for the rollout benchmark: requests from ../shared/traces/mooncake_conversation.jsonl
sent open-loop through one or more gateways, on a background thread, until stopped.

Each trace row becomes a streamed, greedy `/v1/completions` request: its 512-token hash blocks become
`block_tokens` real SmolLM2 tokens each (`BlockText`: equal ids give equal token blocks, so the trace's
prefix sharing survives), the prompt is capped at `max_prompt_tokens`, the output at `max_tokens` (with
`ignore_eos`, so a complete answer has exactly that many tokens). Rows are sent in trace order, at a steady
`rps` (`arrivals="steady"`), or at the trace's own timestamps scaled to a mean of `rps` (`"trace"`: its
bursts of ~10 requests in one second kept); after the last row the trace starts again.

A result is `failed` (a non-200 answer, a transport error, an in-band error event) or `cut` (200, but the
stream ended before [DONE], without a finish_reason, or with fewer completion tokens than asked, as its
usage chunk counts them); `served_by` is the class revision the gateway named in `x-fleet-served-by`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx

from benchmarks.common import BlockText, load_mooncake

TRACE = "mooncake_conversation.jsonl"
TRACE_BLOCK = 512


@dataclass(frozen=True)
class Req:
    row: int  # index in the trace
    prompt: str
    max_tokens: int


@dataclass
class Result:
    row: int
    gateway: str
    sent_at: float  # time.monotonic()
    status: int = 0
    ttft_s: float = math.nan
    tokens: int = 0  # content chunks (a token whose text is held back for UTF-8 sends none)
    completion_tokens: int | None = None  # the final usage chunk's count
    finish_reason: str | None = None
    done: bool = False  # [DONE] seen
    error: str | None = None
    served_by: str = ""  # class revision
    expected: int = 0  # tokens asked for
    finished_at: float = math.nan  # time.monotonic() when the stream ended (or the request failed)

    @property
    def failed(self) -> bool:
        return self.status != 200 or self.error is not None

    @property
    def cut(self) -> bool:
        short = self.completion_tokens is not None and self.completion_tokens < self.expected
        return not self.failed and (not self.done or self.finish_reason is None or short)


def build_requests(blocks: BlockText, block_tokens: int, max_prompt_tokens: int, max_tokens: int,
                   limit: int | None = None) -> list[Req]:
    rows = load_mooncake(TRACE)[:limit]
    requests = []
    for index, row in enumerate(rows):
        num_tokens = min(max_prompt_tokens, math.ceil(row["input_length"] * block_tokens / TRACE_BLOCK))
        ids = blocks.prompt_ids(row["hash_ids"], num_tokens)
        requests.append(Req(index, blocks.text(ids), max(1, min(max_tokens, row["output_length"]))))
    return requests


def arrival_offsets(rows: Sequence[dict], rps: float, arrivals: str) -> Iterator[float]:
    """Seconds after the start at which each request goes, forever (the trace repeats)."""
    if arrivals == "steady":
        yield from (i / rps for i in itertools.count())
        return
    stamps = [row["timestamp"] / 1000.0 for row in rows]
    span = max(stamps[-1] - stamps[0], 1e-3)
    scale = (len(stamps) / rps) / span  # trace seconds -> run seconds, for a mean rate of rps
    for lap in itertools.count():
        for stamp in stamps:
            yield (lap * span + stamp - stamps[0]) * scale


class Traffic:
    """Open-loop sender on its own thread and event loop. `results` grows as answers finish."""

    def __init__(self, gateways: Sequence[str], model: str, requests: Sequence[Req], offsets: Iterator[float]):
        self.gateways, self.model, self.requests, self.offsets = list(gateways), model, list(requests), offsets
        self.results: list[Result] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="traffic", daemon=True)

    def start(self) -> "Traffic":
        self._thread.start()
        return self

    def stop(self, drain_s: float = 120.0) -> None:
        """Stop sending; wait for the requests in flight (up to drain_s)."""
        self._stop.set()
        self._thread.join(drain_s)

    def between(self, start: float, end: float) -> list[Result]:
        """Results of requests sent in [start, end) (time.monotonic())."""
        return [r for r in list(self.results) if start <= r.sent_at < end]

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0, connect=10.0)) as client:
            start, tasks = time.monotonic(), set()
            for index, offset in enumerate(self.offsets):
                delay = start + offset - time.monotonic()
                if delay > 0 and await self._stopped_within(delay):
                    break
                if self._stop.is_set():
                    break
                req = self.requests[index % len(self.requests)]
                task = asyncio.create_task(self._one(client, req, self.gateways[index % len(self.gateways)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)

    async def _stopped_within(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self._stop.is_set():
                return True
            await asyncio.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return self._stop.is_set()

    async def _one(self, client: httpx.AsyncClient, req: Req, gateway: str) -> None:
        result = Result(req.row, gateway, time.monotonic(), expected=req.max_tokens)
        body = {"model": self.model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        try:
            async with client.stream("POST", gateway + "/v1/completions", json=body) as response:
                result.status = response.status_code
                result.served_by = response.headers.get("x-fleet-served-by", "").split(" ")[0]
                if response.status_code != 200:
                    result.error = (await response.aread()).decode(errors="replace")[:300]
                else:
                    await _read_stream(response, result)
        except (httpx.HTTPError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:300]
        result.finished_at = time.monotonic()
        self.results.append(result)


async def _read_stream(response: httpx.Response, result: Result) -> None:
    async for line in response.aiter_lines():
        if line.startswith(": x-fleet-served-by "):  # named late, after keep-alives
            result.served_by = line.split(" ")[2]
        if line == "data: [DONE]":
            result.done = True
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            result.error = json.dumps(chunk["error"])[:300]
        elif chunk.get("choices"):
            if result.tokens == 0:
                result.ttft_s = time.monotonic() - result.sent_at
            result.tokens += 1
            result.finish_reason = chunk["choices"][0].get("finish_reason") or result.finish_reason
        if chunk.get("usage"):
            result.completion_tokens = chunk["usage"].get("completion_tokens")
