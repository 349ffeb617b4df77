"""The change stream's client side: SSE parsing into the contract's messages (fleetctl/controller/watch_contract.py),
one connection (`watch`, `awatch`), and a stream that outlives its connections (`follow`, `follow_sync`).

    async for item in follow(AsyncControllerClient(url, token)):     # the TUI
        if isinstance(item, Disconnected): show_stale(item)            # then it reconnects by itself
        else: changed = state.apply(item)                              # watch_state.FleetState

`follow` yields every message and, when the stream breaks or cannot be opened, one `Disconnected` (why,
when, and the seconds until the next try), then sleeps that long and reconnects, resuming from the last
token seen: the controller sends only the missed deltas, or a snapshot when it cannot (another process, a
restart, too far behind). The wait is full-jitter exponential backoff (uniform(0, min(cap, base * 2**n)) for
the n-th failure in a row; a connection that delivers a message resets n). A stream silent for longer
than SILENT_PINGS x the controller's `ping_s` is taken as broken. Errors that a retry cannot fix (a
missing, unknown or revoked token, a role that is not enough, a bad request) are raised, not retried.
Sleep, randomness and the clock are parameters, so tests run the backoff without waiting.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import aclosing, closing
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pydantic import ValidationError

from fleetctl.client import AsyncControllerClient, ControllerClient
from fleetctl.controller.watch_contract import (
    DELTA, PING, SNAPSHOT, WatchDelta, WatchMessage, WatchPing, WatchSnapshot,
)
from fleetctl.errors import FleetError, Unavailable

DEFAULT_PING_S = 2.0  # the controller's default, until a snapshot says otherwise
SILENT_PINGS = 3.0
MODELS: dict[str, type[WatchSnapshot] | type[WatchDelta] | type[WatchPing]] = {
    SNAPSHOT: WatchSnapshot, DELTA: WatchDelta, PING: WatchPing}


class WatchProtocolError(FleetError):
    """The stream sent an event that does not parse: treated as a broken stream."""

    status = 502
    code = "bad_stream"


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str
    id: str | None = None


# --- SSE ---

def sse_events(lines: Iterable[str]) -> Iterator[SseEvent]:
    """The events of a text/event-stream, line by line (the HTML living standard's rules: `field: value`
    with one optional space, `data` lines joined by newlines, `:` comments, a blank line dispatches, an
    event without data is dropped)."""
    parser = SseParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event


@dataclass
class SseParser:
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, line: str) -> SseEvent | None:
        """Take one line (without its line ending); the event it completes, if any."""
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None  # `retry` and unknown fields are ignored

    def _dispatch(self) -> SseEvent | None:
        event, data, self._event, self._data = self._event or "message", self._data, "", []
        if not data:
            return None
        return SseEvent(event, "\n".join(data), self._id)


def parse_message(event: SseEvent) -> WatchMessage | None:
    """The event as its contract model; None for an event name this client does not know (a newer
    controller's). Raises WatchProtocolError when its data does not parse."""
    model = MODELS.get(event.event)
    if model is None:
        return None
    try:
        return model.model_validate(json.loads(event.data))
    except (ValueError, ValidationError) as exc:
        raise WatchProtocolError(f"the change stream sent a {event.event} that does not parse: "
                                 f"{' '.join(str(exc).split())[:200]}") from None


# --- one connection ---

def watch(client: ControllerClient, resume: str | None = None, silence_s: float | None = None) -> Iterator[WatchMessage]:
    """The messages of one connection, from `resume` when given; ends when the controller ends it.
    `silence_s`: seconds without a byte that break it (Unavailable); default the client's timeout."""
    parser = SseParser()
    with closing(client.watch_stream(resume=resume, silence_s=silence_s)) as lines:
        for line in lines:
            message = _message(parser, line)
            if message is not None:
                yield message


async def awatch(client: AsyncControllerClient, resume: str | None = None,
                 silence_s: float | None = None) -> AsyncIterator[WatchMessage]:
    """`watch` on the asyncio client."""
    parser = SseParser()
    async with aclosing(client.watch_stream(resume=resume, silence_s=silence_s)) as lines:
        async for line in lines:
            message = _message(parser, line)
            if message is not None:
                yield message


def _message(parser: SseParser, line: str) -> WatchMessage | None:
    event = parser.feed(line)
    return None if event is None else parse_message(event)


# --- reconnecting ---

@dataclass(frozen=True)
class Backoff:
    """Full-jitter exponential backoff: the n-th wait in a row is uniform(0, min(cap_s, base_s * 2**n))."""

    base_s: float = 0.5
    cap_s: float = 15.0

    def ceiling(self, attempt: int) -> float:
        return min(self.cap_s, self.base_s * 2 ** min(attempt, 62))


@dataclass(frozen=True)
class Disconnected:
    """The stream broke or could not be opened: why, when, and the seconds until the next try."""

    error: str
    at: datetime
    retry_in_s: float


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Reconnection:
    """What follow and follow_sync keep between connections (the same rules for both)."""

    token: str | None
    backoff: Backoff
    uniform: Callable[[float, float], float]
    clock: Callable[[], datetime]
    ping_s: float = DEFAULT_PING_S
    failures: int = 0

    @property
    def silence_s(self) -> float:
        return SILENT_PINGS * self.ping_s

    def seen(self, message: WatchMessage) -> None:
        self.token, self.failures = message.token, 0
        if isinstance(message, WatchSnapshot):
            self.ping_s = message.ping_s

    def broken(self, error: str) -> Disconnected:
        delay = self.uniform(0.0, self.backoff.ceiling(self.failures))
        self.failures += 1
        return Disconnected(error, self.clock(), delay)


def retryable(exc: FleetError) -> bool:
    """Worth another try: unreachable, timed out, overloaded, failing or a broken stream; not a refusal."""
    return isinstance(exc, (Unavailable, WatchProtocolError)) or exc.status >= 500 or exc.status in (408, 429)


ENDED = "the controller ended the stream"


async def follow(client: AsyncControllerClient, *, resume: str | None = None, backoff: Backoff = Backoff(),
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 uniform: Callable[[float, float], float] = random.uniform,
                 clock: Callable[[], datetime] = utc_now) -> AsyncIterator[WatchMessage | Disconnected]:
    """Every message of the change stream, across reconnections, with a Disconnected at each break."""
    state = Reconnection(resume, backoff, uniform, clock)
    while True:
        try:
            async with aclosing(awatch(client, state.token, state.silence_s)) as messages:
                async for message in messages:
                    state.seen(message)
                    yield message
            why = ENDED
        except FleetError as exc:
            if not retryable(exc):
                raise
            why = exc.message
        gap = state.broken(why)
        yield gap
        await sleep(gap.retry_in_s)


def follow_sync(client: ControllerClient, *, resume: str | None = None, backoff: Backoff = Backoff(),
                sleep: Callable[[float], object] = time.sleep, uniform: Callable[[float, float], float] = random.uniform,
                clock: Callable[[], datetime] = utc_now) -> Iterator[WatchMessage | Disconnected]:
    """`follow` for synchronous callers (the CLI)."""
    state = Reconnection(resume, backoff, uniform, clock)
    while True:
        try:
            with closing(watch(client, state.token, state.silence_s)) as messages:
                for message in messages:
                    state.seen(message)
                    yield message
            why = ENDED
        except FleetError as exc:
            if not retryable(exc):
                raise
            why = exc.message
        gap = state.broken(why)
        yield gap
        sleep(gap.retry_in_s)


__all__ = ["Backoff", "Disconnected", "SseEvent", "SseParser", "WatchProtocolError", "awatch", "follow",
           "follow_sync", "parse_message", "sse_events", "watch"]
