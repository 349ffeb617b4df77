"""Relay an engine's SSE stream to the client, and end it cleanly whatever happens.

- Events are forwarded as they come; while the engine is silent for `keepalive_s` the client gets a
  `: keep-alive` comment, so proxies and clients do not cut a long wait.
- Silence longer than `idle_timeout_s`, a dropped connection or an unreadable stream after tokens were
  sent ends the stream with an error event (`data: {"error": {...}}`), a final chunk whose finish_reason is
  "error", then `data: [DONE]`. An engine's own in-band error event is passed on and closed the same way.
  The client never hangs and never mistakes a cut answer for a complete one.
- Closing the relay (the client went away, or the stream ended) closes the upstream connection, which
  makes the engine abort the request and free its KV blocks.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fleetctl.gateway.upstream import END, PENDING, TRANSPORT_ERRORS, SSEEvent, SSEReader, is_first_token, num_new_tokens

KEEPALIVE = ": keep-alive\n\n"
DONE = "data: [DONE]\n\n"


def sse_data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


@dataclass
class ChunkHeader:
    """What the final error chunk repeats from the stream's chunks (or defaults when none came)."""

    chat: bool
    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def learn(self, chunk: dict[str, Any]) -> None:
        self.id = str(chunk.get("id") or self.id)
        self.model = str(chunk.get("model") or self.model)
        created = chunk.get("created")
        if isinstance(created, int):
            self.created = created

    def error_chunk(self) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "error"}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "error"}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}


def error_event(message: str, code: int = 502, error_type: str = "ServiceUnavailableError") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def error_ending(header: ChunkHeader, message: str, code: int = 502) -> list[str]:
    """What a stream that cannot go on ends with."""
    return [sse_data(error_event(message, code)), sse_data(header.error_chunk()), DONE]


@dataclass
class StreamWatch:
    """Hooks the relay calls as the stream progresses (the dispatcher's bookkeeping and metrics)."""

    on_first_token: Callable[[], None] = lambda: None
    on_tokens: Callable[[int], None] = lambda n: None
    on_error: Callable[[str], None] = lambda reason: None  # after tokens were sent: the metric label
    on_usage: Callable[[dict[str, Any]], None] = lambda usage: None  # a chunk's usage (stream_options.include_usage)


async def relay(reader: SSEReader, held: list[SSEEvent], header: ChunkHeader, keepalive_s: float,
                idle_timeout_s: float, watch: StreamWatch) -> AsyncIterator[str]:
    """The client's stream: the events held while waiting for the first token, then the rest."""
    saw_finish = False
    for event in held:
        saw_finish |= _note(event, header, watch)
        yield event.wire()
    if held and held[-1].is_done:
        return
    idle_since = time.monotonic()
    while True:
        try:
            event = await reader.next(keepalive_s)
        except TRANSPORT_ERRORS as exc:
            watch.on_error("disconnect")
            for line in error_ending(header, f"the engine's stream failed: {type(exc).__name__}"):
                yield line
            return
        if event is PENDING:
            if time.monotonic() - idle_since > idle_timeout_s:
                watch.on_error("idle_timeout")
                for line in error_ending(header, f"the engine sent nothing for {idle_timeout_s:g}s", 504):
                    yield line
                return
            yield KEEPALIVE
            continue
        if event is END:
            if not saw_finish:
                watch.on_error("truncated")
                for line in error_ending(header, "the engine's stream ended before the answer was complete"):
                    yield line
            else:
                yield DONE  # the engine closed without [DONE]: end the stream properly anyway
            return
        idle_since = time.monotonic()
        if event.is_done:
            if not saw_finish:
                watch.on_error("truncated")
                yield sse_data(header.error_chunk())
            yield DONE
            return
        saw_finish |= _note(event, header, watch)
        yield event.wire()
        if "error" in (event.json() or {}):
            watch.on_error("engine_error")
            yield sse_data(header.error_chunk())
            yield DONE
            return


def _note(event: SSEEvent, header: ChunkHeader, watch: StreamWatch) -> bool:
    """Update bookkeeping for one forwarded event; True if it carries a finish reason."""
    chunk = event.json()
    if chunk is None:
        return False
    if "error" not in chunk:
        header.learn(chunk)
    if is_first_token(event):
        watch.on_first_token()
    tokens = num_new_tokens(event)
    if tokens:
        watch.on_tokens(tokens)
    if isinstance(chunk.get("usage"), dict):
        watch.on_usage(chunk["usage"])
    return any(c.get("finish_reason") is not None for c in chunk.get("choices") or [])
