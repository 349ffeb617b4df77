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
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from fleetctl.httpwire import EngineClient, EngineConnectError, EngineHTTPError, EngineResponse

PENDING = object()  # next() timed out; the read goes on
END = object()  # the stream ended

RETRYABLE_STATUS = {429: "overloaded", 503: "unavailable"}
DRAIN_AFTER_DONE_S = 0.5  # how long close() waits for a finished stream's body to end (keeps the connection)
TRANSPORT_ERRORS = (EngineHTTPError, OSError)  # what reading an engine's answer can raise, timeouts aside


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
    if isinstance(exc, EngineConnectError):
        return UpstreamFailure("connect", f"{url}: {exc}", hard=True)
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamFailure("timeout", f"{url}: timed out", hard=True)
    return UpstreamFailure("disconnect", f"{url}: connection failed ({type(exc).__name__}: {exc})", hard=True)


def check_status(status: int, body: bytes, headers: Mapping[str, str], url: str) -> None:
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


def json_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


_JSON_HEADERS = {"content-type": "application/json", "accept": "*/*"}


async def post_json(client: EngineClient, url: str, path: str, body: dict[str, Any], headers: dict[str, str],
                    connect_s: float, total_s: float) -> tuple[dict[str, Any], Mapping[str, str]]:
    """A non-streamed request: the JSON answer, or UpstreamFailure / EngineRejected."""

    async def call() -> tuple[int, bytes, Mapping[str, str]]:
        response = await client.request("POST", url + path, json_body(body), {**_JSON_HEADERS, **headers}, connect_s)
        try:
            return response.status, await response.read(), response.headers
        finally:
            await response.aclose()

    try:
        status, content, response_headers = await asyncio.wait_for(call(), total_s)
    except (*TRANSPORT_ERRORS, asyncio.TimeoutError) as exc:
        raise failure_from_exception(exc, url) from None
    check_status(status, content, response_headers, url)
    try:
        answer = json.loads(content)
    except ValueError:
        raise UpstreamFailure("error_5xx", f"{url}: the answer is not JSON") from None
    if not isinstance(answer, dict):
        raise UpstreamFailure("error_5xx", f"{url}: the answer is not a JSON object")
    return answer, response_headers


async def open_stream(client: EngineClient, url: str, path: str, body: dict[str, Any], headers: dict[str, str],
                      connect_s: float, first_byte_s: float) -> EngineResponse:
    """Send a streamed request; the open 200 response (the caller closes it), or UpstreamFailure / EngineRejected."""
    try:
        response = await asyncio.wait_for(
            client.request("POST", url + path, json_body(body), {**_JSON_HEADERS, **headers}, connect_s), first_byte_s)
    except (*TRANSPORT_ERRORS, asyncio.TimeoutError) as exc:
        raise failure_from_exception(exc, url) from None
    if response.status != 200:
        try:
            content = await asyncio.wait_for(response.read(), connect_s)
        except (*TRANSPORT_ERRORS, asyncio.TimeoutError):
            content = b""
        finally:
            await response.aclose()
        check_status(response.status, content, response.headers, url)
    return response


class SSEEvent:
    """One server-sent event: its lines, without the blank line that ends it. Its data and JSON are parsed
    once, on first use (the relay asks each event several questions)."""

    __slots__ = ("raw", "_data", "_json")
    _UNSET: Any = object()

    def __init__(self, raw: str):
        self.raw = raw
        self._data: Any = SSEEvent._UNSET
        self._json: Any = SSEEvent._UNSET

    def __repr__(self) -> str:
        return f"SSEEvent({self.raw!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SSEEvent) and other.raw == self.raw

    __hash__ = None  # type: ignore[assignment]

    @property
    def is_comment(self) -> bool:
        return all(line.startswith(":") for line in self.raw.splitlines())

    @property
    def data(self) -> str | None:
        if self._data is SSEEvent._UNSET:
            raw = self.raw
            if raw.startswith("data:") and "\n" not in raw:  # the usual case: one data line
                self._data = raw[5:].lstrip()
            else:
                lines = [line[5:].lstrip() for line in raw.splitlines() if line.startswith("data:")]
                self._data = "\n".join(lines) if lines else None
        return self._data

    @property
    def is_done(self) -> bool:
        return self.data == "[DONE]"

    def json(self) -> dict[str, Any] | None:
        if self._json is SSEEvent._UNSET:
            self._json = _parse_chunk(self.data)
        return self._json

    def wire(self) -> str:
        return self.raw + "\n\n"


def _parse_chunk(data: str | None) -> dict[str, Any] | None:
    if data is None or data == "[DONE]":
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def split_events(buffer: bytes) -> tuple[list[SSEEvent], bytes]:
    """The complete events in `buffer` (each ends with a blank line) and what is left of it."""
    if b"\r" in buffer:
        buffer = buffer.replace(b"\r\n", b"\n")  # SSE allows CRLF; engines send LF
    *whole, rest = buffer.split(b"\n\n")
    events = []
    for part in whole:
        text = part.strip(b"\n").decode("utf-8", errors="replace")
        if text:
            events.append(SSEEvent(text))
    return events, rest


class SSEReader:
    """The events of an open SSE response. Reads what the connection buffered, parses it into events and
    waits only when nothing is left: no task per event."""

    def __init__(self, response: EngineResponse):
        self.response = response
        self.saw_done = False  # `data: [DONE]` was read: the answer is complete
        self._events: deque[SSEEvent] = deque()
        self._rest = b""  # the start of an event whose end has not arrived
        self._ended = False

    async def next(self, timeout_s: float | None) -> Any:
        """The next SSEEvent, PENDING after timeout_s, END at the end; transport errors raise."""
        while not self._events:
            if self._ended:
                return END
            data = self.response.take_buffered()
            if data:
                events, self._rest = split_events(self._rest + data)
                self._events.extend(events)
            elif self.response.complete:
                tail = self._rest.strip(b"\r\n").decode("utf-8", errors="replace")
                if tail:
                    self._events.append(SSEEvent(tail))
                self._ended = True
            else:
                self.response.raise_if_failed()
                if not await self.response.wait_for_data(timeout_s):
                    return PENDING
        event = self._events.popleft()
        self.saw_done |= event.is_done
        return event

    async def close(self) -> None:
        """After a complete answer, wait (briefly) for the body's end so the connection goes back to the pool:
        closing it unread costs the next request to this engine a new TCP connection on its critical path.
        Otherwise close the connection: the engine sees the client go and aborts the request."""
        if self.saw_done:
            deadline = time.monotonic() + DRAIN_AFTER_DONE_S
            try:
                while not self.response.complete and (left := deadline - time.monotonic()) > 0:
                    self.response.raise_if_failed()
                    await self.response.wait_for_data(left)
                    self.response.take_buffered()  # after [DONE]: nothing the client needs
            except TRANSPORT_ERRORS:
                pass  # the connection broke: aclose() closes it
        await self.response.aclose()


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
