"""Relaying an engine's stream: keep-alives while it is silent, and a clean error ending whatever goes wrong."""

from __future__ import annotations

import json
from collections.abc import Iterable

from fleetctl.gateway.relay import DONE, KEEPALIVE, ChunkHeader, StreamWatch, relay
from fleetctl.gateway.upstream import END, PENDING, SSEEvent, is_first_token, num_new_tokens
from fleetctl.httpwire import EngineDisconnected


def chunk(text: str = "", finish: str | None = None) -> SSEEvent:
    body = {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return SSEEvent("data: " + json.dumps(body))


class FakeReader:
    """Answers next() from a script: SSEEvent, PENDING, END, or an exception to raise."""

    def __init__(self, script: Iterable) -> None:
        self.script = list(script)

    async def next(self, timeout_s: float | None):
        item = self.script.pop(0) if self.script else END
        if isinstance(item, Exception):
            raise item
        return item


class Watch:
    def __init__(self) -> None:
        self.first = 0
        self.tokens = 0
        self.errors: list[str] = []

    def hooks(self) -> StreamWatch:
        return StreamWatch(lambda: setattr(self, "first", self.first + 1),
                           lambda n: setattr(self, "tokens", self.tokens + n), self.errors.append)


async def run(script: Iterable, held: list[SSEEvent] | None = None, idle_timeout_s: float = 60.0) -> tuple[list[str], Watch]:
    watch = Watch()
    header = ChunkHeader(chat=False, id="cmpl-default", model="m")
    lines = [line async for line in relay(FakeReader(script), held or [], header, 0.01, idle_timeout_s, watch.hooks())]
    return lines, watch


def data(lines: list[str]) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


async def test_a_whole_stream_passes_through() -> None:
    lines, watch = await run([chunk("b"), PENDING, chunk("c", "length"), SSEEvent("data: [DONE]")], held=[chunk("a")])
    assert [c["choices"][0]["text"] for c in data(lines)] == ["a", "b", "c"]
    assert KEEPALIVE in lines and lines[-1] == DONE
    assert watch.tokens == 3 and watch.errors == []


async def test_a_dropped_connection_ends_with_an_error_event_and_an_error_chunk() -> None:
    lines, watch = await run([chunk("b"), EngineDisconnected("peer closed")], held=[chunk("a")])
    error, final = data(lines)[-2:]
    assert error["error"]["code"] == 502 and "EngineDisconnected" in error["error"]["message"]
    assert final["id"] == "cmpl-1" and final["choices"][0]["finish_reason"] == "error"
    assert lines[-1] == DONE and watch.errors == ["disconnect"]


async def test_an_end_without_a_finish_reason_is_an_error_but_a_finished_one_is_not() -> None:
    lines, watch = await run([chunk("b"), END], held=[chunk("a")])
    assert data(lines)[-1]["choices"][0]["finish_reason"] == "error" and watch.errors == ["truncated"]
    lines, watch = await run([chunk("b", "stop"), END], held=[chunk("a")])
    assert lines[-1] == DONE and watch.errors == []


async def test_silence_past_the_idle_timeout_ends_the_stream() -> None:
    lines, watch = await run([PENDING] * 1000, held=[chunk("a")], idle_timeout_s=0.0)
    assert data(lines)[-2]["error"]["code"] == 504 and watch.errors == ["idle_timeout"]


async def test_an_engines_in_band_error_is_passed_on_and_closed() -> None:
    error = SSEEvent('data: {"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}')
    lines, watch = await run([error, chunk("never")], held=[chunk("a")])
    assert data(lines)[-2]["error"]["message"] == "boom" and data(lines)[-1]["choices"][0]["finish_reason"] == "error"
    assert watch.errors == ["engine_error"]


def test_first_token_and_token_counting() -> None:
    role_only = SSEEvent('data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}')
    assert not is_first_token(role_only) and num_new_tokens(role_only) == 0
    assert is_first_token(chunk("x")) and num_new_tokens(chunk("x")) == 1
    assert is_first_token(chunk("", "stop")) and is_first_token(SSEEvent("data: [DONE]"))
    assert SSEEvent(": keep-alive").is_comment and not is_first_token(SSEEvent(": keep-alive"))
