"""HTTP calls to engines, with a timeout on every step, and what their failures mean.

A failure before the first token is an `UpstreamFailure` whose `reason` is the label of
fleet_gateway_retries_total and which says whether another engine may be tried and whether this engine
should be taken out of rotation at once (`hard`):

    connect        refused / reset while connecting        retry, hard
    timeout        no answer / no first token in time       retry, hard
    disconnect     the stream ended before a token          retry, hard
    overloaded     429                                      retry
    unavailable    503 (draining, not ready)                retry, hard
    error_5xx      500, 502, 504, ...                       retry (down after a few in a row)
    error_event    an in-band error before any token        retry

A 4xx other than 429 is the client's problem (`EngineRejected`): passed on as the engine said it, never retried.

Streams are read as SSE events (`SSEReader`): `next(timeout)` returns the next event, or PENDING when the
timeout passes first, without cancelling the read in progress, so the caller can send keep-alives and keep
waiting.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

PENDING = object()  # next() timed out; the read goes on
END = object()  # the stream ended

RETRYABLE_STATUS = {429: "overloaded", 503: "unavailable"}
DRAIN_AFTER_DONE_S = 0.5  # how long close() waits for a finished stream's body to end (keeps the connection)


class UpstreamFailure(Exception):
    def __init__(self, reason: str, message: str, *, status: int | None = None, body: bytes | None = None,
                 retry_after: str | None = None, hard: bool = False):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.status = status
        self.body = body
        self.retry_after = retry_after
        self.hard = hard


class EngineRejected(Exception):
    """The engine refused the request itself (4xx other than 429): the answer goes to the client as is."""

    def __init__(self, status: int, body: bytes, content_type: str | None):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body
        self.content_type = content_type


def failure_from_exception(exc: BaseException, url: str) -> UpstreamFailure:
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return UpstreamFailure("connect", f"{url}: cannot connect ({type(exc).__name__})", hard=True)
    if isinstance(exc, (asyncio.TimeoutError, httpx.TimeoutException)):
        return UpstreamFailure("timeout", f"{url}: timed out ({type(exc).__name__})", hard=True)
    return UpstreamFailure("disconnect", f"{url}: connection failed ({type(exc).__name__}: {exc})", hard=True)


def check_status(status: int, body: bytes, headers: httpx.Headers, url: str) -> None:
    """Raise for anything but 200: EngineRejected for the client's own errors, UpstreamFailure otherwise."""
    if status == 200:
        return
    if 400 <= status < 500 and status not in RETRYABLE_STATUS:
        raise EngineRejected(status, body, headers.get("content-type"))
    reason = RETRYABLE_STATUS.get(status, "error_5xx")
    message = f"{url}: HTTP {status} {error_message(body)}".rstrip()
    raise UpstreamFailure(reason, message, status=status, body=body, retry_after=headers.get("retry-after"),
                          hard=status == 503)


def error_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else a short prefix of the body."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def timeouts(connect_s: float, read_s: float | None) -> httpx.Timeout:
    return httpx.Timeout(connect=connect_s, read=read_s, write=connect_s, pool=connect_s)


async def post_json(client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any], headers: dict[str, str],
                    connect_s: float, total_s: float) -> tuple[dict[str, Any], httpx.Headers]:
    """A non-streamed request: the JSON answer, or UpstreamFailure / EngineRejected."""
    try:
        response = await asyncio.wait_for(
            client.post(url + path, json=body, headers=headers, timeout=timeouts(connect_s, total_s)), total_s)
    except (httpx.HTTPError, asyncio.TimeoutError, OSError) as exc:
        raise failure_from_exception(exc, url) from None
    check_status(response.status_code, response.content, response.headers, url)
    try:
        answer = response.json()
    except ValueError:
        raise UpstreamFailure("error_5xx", f"{url}: the answer is not JSON") from None
    if not isinstance(answer, dict):
        raise UpstreamFailure("error_5xx", f"{url}: the answer is not a JSON object")
    return answer, response.headers


async def open_stream(client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any], headers: dict[str, str],
                      connect_s: float, first_byte_s: float) -> httpx.Response:
    """Send a streamed request; the open 200 response (the caller closes it), or UpstreamFailure / EngineRejected."""
    request = client.build_request("POST", url + path, json=body, headers=headers, timeout=timeouts(connect_s, None))
    try:
        response = await asyncio.wait_for(client.send(request, stream=True), first_byte_s)
    except (httpx.HTTPError, asyncio.TimeoutError, OSError) as exc:
        raise failure_from_exception(exc, url) from None
    if response.status_code != 200:
        try:
            content = await asyncio.wait_for(response.aread(), connect_s)
        except (httpx.HTTPError, asyncio.TimeoutError, OSError):
            content = b""
        finally:
            await response.aclose()
        check_status(response.status_code, content, response.headers, url)
    return response


@dataclass(frozen=True)
class SSEEvent:
    raw: str  # the event's lines, without the blank line that ends it

    @property
    def is_comment(self) -> bool:
        return all(line.startswith(":") for line in self.raw.splitlines())

    @property
    def data(self) -> str | None:
        lines = [line[5:].lstrip() for line in self.raw.splitlines() if line.startswith("data:")]
        return "\n".join(lines) if lines else None

    @property
    def is_done(self) -> bool:
        return self.data == "[DONE]"

    def json(self) -> dict[str, Any] | None:
        data = self.data
        if data is None or data == "[DONE]":
            return None
        try:
            value = json.loads(data)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def wire(self) -> str:
        return self.raw + "\n\n"


@dataclass
class SSEReader:
    """The events of an open SSE response."""

    response: httpx.Response
    saw_done: bool = field(default=False, init=False)  # `data: [DONE]` was read: the answer is complete
    _events: AsyncIterator[SSEEvent] | None = field(default=None, init=False)
    _next: asyncio.Future | None = field(default=None, init=False)

    async def _iterate(self) -> AsyncIterator[SSEEvent]:
        lines: list[str] = []
        async for line in self.response.aiter_lines():
            if line:
                lines.append(line)
            elif lines:
                yield SSEEvent("\n".join(lines))
                lines = []
        if lines:
            yield SSEEvent("\n".join(lines))

    async def next(self, timeout_s: float | None) -> Any:
        """The next SSEEvent, PENDING after timeout_s, END at the end; transport errors raise."""
        if self._events is None:
            self._events = self._iterate()
        if self._next is None:
            self._next = asyncio.ensure_future(self._events.__anext__())
        done, _ = await asyncio.wait({self._next}, timeout=timeout_s)
        if not done:
            return PENDING
        future, self._next = self._next, None
        try:
            event = future.result()
        except StopAsyncIteration:
            return END
        self.saw_done |= event.is_done
        return event

    async def close(self) -> None:
        """After a complete answer, read the body's end (briefly) so the connection goes back to the pool:
        closing it unread costs the next request to this engine a new TCP connection on its critical path.
        Otherwise close the connection: the engine sees the client go and aborts the request."""
        if self.saw_done and self._next is None and self._events is not None:
            try:
                await asyncio.wait_for(self._drain(), DRAIN_AFTER_DONE_S)
            except (asyncio.TimeoutError, httpx.HTTPError, OSError):
                pass  # the engine kept the body open: close the connection as for an unfinished answer
        if self._next is not None and not self._next.done():
            self._next.cancel()
            try:
                await self._next
            except BaseException:  # the cancelled read, or whatever it was failing with
                pass
        self._next = None
        await self.response.aclose()


    async def _drain(self) -> None:
        assert self._events is not None
        async for _ in self._events:
            pass


def is_first_token(event: SSEEvent) -> bool:
    """Whether an event carries generated output (text, a finish reason, an error or the end)."""
    if event.is_done:
        return True
    chunk = event.json()
    if chunk is None:
        return False
    if "error" in chunk:
        return True
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or choice.get("finish_reason") is not None:
            return True
        if delta.get("tool_calls") or delta.get("reasoning_content"):
            return True
    return False


def num_new_tokens(event: SSEEvent) -> int:
    """Chunks carrying text count as one token each (engines send a chunk per token or per step)."""
    chunk = event.json()
    if not chunk:
        return 0
    return sum(1 for c in chunk.get("choices") or [] if c.get("text") or (c.get("delta") or {}).get("content"))
