"""The change stream's client (fleetctl/watch_client.py): SSE parsing edge cases, and `follow` /
`follow_sync` against a scripted SSE server on loopback: full-jitter backoff (sleep and randomness
injected, so nothing waits), reset after a connection that delivered, resuming from the last token, silence
as a broken stream, refusals raised rather than retried."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sse_server import CLOSE, HANG, Script, SseServer, delta, snapshot

from fleetctl.client import AsyncControllerClient, ControllerClient
from fleetctl.controller.server import free_port
from fleetctl.controller.watch_contract import WatchDelta, WatchPing, WatchSnapshot
from fleetctl.errors import AuthError
from fleetctl.watch_client import (
    Backoff, Disconnected, SseEvent, WatchProtocolError, follow, follow_sync, parse_message, sse_events,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def highest(_low: float, high: float) -> float:
    return high


# --- SSE ---

def test_sse_fields_comments_multiline_data_and_line_endings() -> None:
    lines = [": a comment", "id: e-1", "event: delta", "data: {\"a\":", "data:1}", "", "", "retry: 10",
             "data: plain\r", "", "id: e-2", "event: ping", "", "event:snapshot", "data:  two spaces", ""]
    assert list(sse_events(lines)) == [
        SseEvent("delta", '{"a":\n1}', "e-1"),
        SseEvent("message", "plain", "e-1"),  # the last id stays; no event name: "message"
        SseEvent("snapshot", " two spaces", "e-2"),  # an event without data (the ping above) is dropped
    ]


def test_an_event_cut_off_before_its_blank_line_is_not_dispatched() -> None:
    assert list(sse_events(["event: delta", "data: {}"])) == []


def test_messages_parse_into_the_contract_models_and_unknown_events_are_skipped() -> None:
    ping = parse_message(SseEvent("ping", '{"token": "e-3", "at": "t"}'))
    assert isinstance(ping, WatchPing) and ping.token == "e-3"
    assert parse_message(SseEvent("newfangled", "{}")) is None  # a newer controller's event
    with pytest.raises(WatchProtocolError, match="delta that does not parse"):
        parse_message(SseEvent("delta", "{not json"))
    with pytest.raises(WatchProtocolError):
        parse_message(SseEvent("delta", '{"token": "e-1"}'))  # `at` missing


def test_the_backoff_ceiling_doubles_from_half_a_second_to_fifteen() -> None:
    assert [Backoff().ceiling(n) for n in range(8)] == [0.5, 1, 2, 4, 8, 15, 15, 15]
    assert Backoff().ceiling(10_000) == 15


# --- follow ---

async def test_an_unreachable_controller_is_a_disconnected_per_try_with_full_jitter_backoff() -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    client = AsyncControllerClient(f"http://127.0.0.1:{free_port()}", "t")  # nothing listens there
    stream = follow(client, sleep=sleep, uniform=highest, clock=lambda: T0)
    gaps = [await anext(stream) for _ in range(7)]
    await stream.aclose()
    assert all(isinstance(g, Disconnected) and g.at == T0 and "unreachable" in g.error for g in gaps)
    assert [g.retry_in_s for g in gaps] == [0.5, 1, 2, 4, 8, 15, 15]
    assert sleeps == [0.5, 1, 2, 4, 8, 15]
    drawn: list[tuple[float, float]] = []
    jittered = follow(client, sleep=sleep, uniform=lambda lo, hi: drawn.append((lo, hi)) or hi / 4)
    assert (await anext(jittered)).retry_in_s == 0.125 and drawn == [(0.0, 0.5)]  # uniform(0, ceiling)
    await jittered.aclose()
    await client.aclose()


async def test_a_connection_that_delivers_resets_the_backoff_and_the_next_one_resumes_from_its_token() -> None:
    scripts = [Script([snapshot("e-0"), delta("e-1")], CLOSE), Script([delta("e-2")], CLOSE)]
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    with SseServer(scripts) as server:
        async with AsyncControllerClient(server.url, "t") as client:
            stream = follow(client, sleep=sleep, uniform=highest, clock=lambda: T0)
            items = [await anext(stream) for _ in range(6)]
            await stream.aclose()
    kinds = [type(item).__name__ for item in items]
    assert kinds == ["WatchSnapshot", "WatchDelta", "Disconnected", "WatchDelta", "Disconnected", "WatchDelta"]
    assert items[2].error == "the controller ended the stream"
    assert [items[2].retry_in_s, items[4].retry_in_s] == [0.5, 0.5]  # each connection delivered: reset
    assert server.targets[0] == "/api/v1/watch" and server.targets[1:3] == ["/api/v1/watch?resume=e-1",
                                                                           "/api/v1/watch?resume=e-2"]


async def test_silence_for_three_pings_is_a_broken_stream() -> None:
    # the first connection learns ping_s from its snapshot; the next one is opened with 3 x ping_s of patience
    scripts = [Script([snapshot("e-0", ping_s=0.1)], CLOSE), Script([delta("e-1")], HANG)]
    with SseServer(scripts) as server:
        async with AsyncControllerClient(server.url, "t") as client:
            stream = follow(client, uniform=lambda lo, hi: 0.0)
            items = [await anext(stream) for _ in range(4)]
            await stream.aclose()
    assert [type(i) for i in items] == [WatchSnapshot, Disconnected, WatchDelta, Disconnected]
    assert "sent nothing for 0.3 s" in items[3].error


async def test_a_refused_token_is_raised_not_retried() -> None:
    body = b'{"error": {"code": "unauthorized", "message": "unknown or revoked token", "field": null}}'
    with SseServer([Script(status=401, body=body)]) as server:
        async with AsyncControllerClient(server.url, "t") as client:
            with pytest.raises(AuthError, match="unknown or revoked token"):
                await anext(follow(client))
    assert len(server.targets) == 1


async def test_a_stream_that_sends_garbage_is_broken_and_reconnects() -> None:
    scripts = [Script([b"event: delta\ndata: {oops\n\n"], HANG), Script([snapshot("e-7")], HANG)]
    with SseServer(scripts) as server:
        async with AsyncControllerClient(server.url, "t") as client:
            stream = follow(client, uniform=lambda lo, hi: 0.0)
            gap, fresh = await anext(stream), await anext(stream)
            await stream.aclose()
    assert isinstance(gap, Disconnected) and "does not parse" in gap.error
    assert isinstance(fresh, WatchSnapshot) and fresh.token == "e-7"


def test_follow_sync_is_the_same_for_the_cli() -> None:
    scripts = [Script([snapshot("e-0"), delta("e-1")], CLOSE), Script([delta("e-2")], HANG)]
    sleeps: list[float] = []
    with SseServer(scripts) as server, ControllerClient(server.url, "t") as client:
        stream = follow_sync(client, sleep=sleeps.append, uniform=highest, clock=lambda: T0)
        items = [next(stream) for _ in range(4)]
        stream.close()
    assert [type(i) for i in items] == [WatchSnapshot, WatchDelta, Disconnected, WatchDelta]
    assert sleeps == [0.5] and server.targets[1] == "/api/v1/watch?resume=e-1"
    with ControllerClient(f"http://127.0.0.1:{free_port()}", "t") as client:
        stream = follow_sync(client, sleep=sleeps.append, uniform=highest, clock=lambda: T0)
        assert [next(stream).retry_in_s for _ in range(3)] == [0.5, 1, 2]
        stream.close()
