"""The gateway's HTTP/1.1 client to engines, against real loopback servers: scripted byte-level servers for
the edge cases (chunked and Content-Length bodies, kept-alive reuse, a connection the server closed while
idle, a connection cut mid-body, nothing listening) and the SSE reader on top of it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from fleetctl.gateway.upstream import END, PENDING, SSEEvent, SSEReader, open_stream, post_json, split_events, UpstreamFailure
from fleetctl.httpwire import (
    EngineClient,
    EngineConnectError,
    EngineDisconnected,
    EngineProtocolError,
)


class ScriptedServer:
    """A loopback TCP server; `answer(request_bytes, writer)` writes whatever the test wants per request."""

    def __init__(self, answer: Callable[[bytes, asyncio.StreamWriter], object]):
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> "ScriptedServer":
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                result = self.answer(request, writer)
                if asyncio.iscoroutine(result):
                    result = await result
                await writer.drain()
                if result == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def fixed(body: bytes, status: str = "200 OK", extra: str = "") -> Callable[[bytes, asyncio.StreamWriter], None]:
    def answer(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body)
    return answer


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def test_a_json_post_is_sent_whole_and_answered_and_the_connection_is_reused() -> None:
    async with ScriptedServer(fixed(b'{"ok": true}')) as server:
        client = EngineClient()
        for _ in range(3):
            answer, headers = await post_json(client, server.url, "/v1/completions", {"prompt": "hé"},
                                              {"x-request-id": "r1"}, 1.0, 5.0)
            assert answer == {"ok": True} and headers["content-type"] == "application/json"
        await client.aclose()
    assert server.connections == 1  # kept alive between calls
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert b"POST /v1/completions HTTP/1.1" in head and b"x-request-id: r1" in head
    assert json.loads(body) == {"prompt": "hé"}


async def test_a_chunked_stream_arrives_piece_by_piece() -> None:
    release = asyncio.Event()

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(b"data: 1\n\n"), b"data: 1\n\n"))
        await writer.drain()
        await release.wait()
        writer.write(chunked([b"data: 2\n\n", b"data: [DONE]\n\n"]))

    async with ScriptedServer(answer) as server:
        client = EngineClient()
        response = await client.request("POST", server.url + "/x", b"{}", {}, 1.0)
        reader = SSEReader(response)
        assert (await reader.next(1.0)).raw == "data: 1"
        assert await reader.next(0.05) is PENDING  # nothing yet; the read is not lost
        release.set()
        assert (await reader.next(1.0)).raw == "data: 2"
        assert (await reader.next(1.0)).is_done and reader.saw_done
        assert await reader.next(1.0) is END
        await reader.close()
        assert response.complete and response.keep_alive
        await client.aclose()


async def test_a_connection_the_engine_closed_while_idle_is_replaced_without_an_error() -> None:
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> str:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        return "close"  # the server closes after every answer, without saying so in a header

    async with ScriptedServer(answer) as server:
        client = EngineClient()
        for _ in range(3):
            answer_json, _ = await post_json(client, server.url, "/", {}, {}, 1.0, 5.0)
            assert answer_json == {}
            await asyncio.sleep(0.05)  # the close reaches the client while the connection sits idle
        await client.aclose()
    assert server.connections == 3


async def test_a_request_lost_to_a_closing_kept_alive_connection_is_sent_again_on_a_new_one() -> None:
    """The race the idle expiry makes rare: the engine closes a kept-alive connection just as the gateway
    sends on it, so the request dies without a byte of answer. The engine never handled it: send it again."""
    answered: list[int] = []

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> str | None:
        answered.append(len(answered))
        if len(answered) == 2:
            return "close"  # the second request on the first connection: closed unanswered
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        return None

    async with ScriptedServer(answer) as server:
        client = EngineClient()
        for _ in range(2):
            answer_json, _ = await post_json(client, server.url, "/", {}, {}, 1.0, 5.0)
            assert answer_json == {}
        await client.aclose()
    assert server.connections == 2 and len(answered) == 3


async def test_a_stream_cut_mid_body_raises_disconnected_and_a_finished_one_does_not() -> None:
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> str:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(b"data: 1\n\n"), b"data: 1\n\n"))
        return "close"  # no terminating chunk

    async with ScriptedServer(answer) as server:
        client = EngineClient()
        response = await client.request("POST", server.url + "/", b"{}", {}, 1.0)
        reader = SSEReader(response)
        assert (await reader.next(1.0)).raw == "data: 1"
        with pytest.raises(EngineDisconnected):
            await reader.next(1.0)
        await reader.close()
        await client.aclose()


async def test_nothing_listening_is_a_connect_failure_and_a_bad_answer_a_protocol_error() -> None:
    client = EngineClient()
    async with ScriptedServer(fixed(b"")) as server:
        url = server.url
    with pytest.raises(EngineConnectError):
        await client.request("POST", url + "/", b"{}", {}, 1.0)
    with pytest.raises(UpstreamFailure) as excinfo:
        await open_stream(client, url, "/", {}, {}, 1.0, 1.0)
    assert excinfo.value.reason == "connect" and excinfo.value.hard

    def garbage(request: bytes, writer: asyncio.StreamWriter) -> str:
        writer.write(b"SMTP ready\r\n\r\n")
        return "close"

    async with ScriptedServer(garbage) as server:
        with pytest.raises(EngineProtocolError):
            await client.request("POST", server.url + "/", b"{}", {}, 1.0)
    await client.aclose()


async def test_an_error_status_is_read_whole_and_a_header_with_a_line_break_is_refused() -> None:
    async with ScriptedServer(fixed(b'{"error": {"message": "busy"}}', "429 Too Many Requests", "retry-after: 7\r\n")) as server:
        client = EngineClient()
        with pytest.raises(UpstreamFailure) as excinfo:
            await open_stream(client, server.url, "/", {}, {}, 1.0, 1.0)
        assert (excinfo.value.reason, excinfo.value.retry_after) == ("overloaded", "7") and "busy" in excinfo.value.message
        with pytest.raises(EngineProtocolError):
            await client.request("POST", server.url + "/", b"{}", {"x-request-id": "a\r\nx-evil: 1"}, 1.0)
        await client.aclose()


async def test_a_slow_reader_pauses_the_socket_and_still_gets_every_byte() -> None:
    parts = [bytes([65 + i % 26]) * 65536 for i in range(16)]  # 1 MiB, past the pause threshold

    def answer(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(parts))

    async with ScriptedServer(answer) as server:
        client = EngineClient()
        response = await client.request("POST", server.url + "/", b"{}", {}, 1.0)
        await asyncio.sleep(0.2)  # let the server fill the buffers
        got = bytearray()
        async for data in response.chunks():
            got += data
        assert bytes(got) == b"".join(parts)
        await response.aclose()
        await client.aclose()


def test_events_split_on_blank_lines_with_lf_or_crlf_and_keep_the_unfinished_rest() -> None:
    events, rest = split_events(b"data: a\n\n: keep-alive\r\n\r\ndata: b\ndata: c\n\ndata: par")
    assert [e.raw for e in events] == ["data: a", ": keep-alive", "data: b\ndata: c"]
    assert events[1].is_comment and events[2].data == "b\nc" and rest == b"data: par"
    assert SSEEvent('data: {"x": 1}').json() == {"x": 1} and SSEEvent("data: [DONE]").json() is None
