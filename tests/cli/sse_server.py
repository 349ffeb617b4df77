"""A scripted SSE server on loopback for the change-stream client's tests: each connection is answered by the
next script (the bytes of its events, then close or hang), and every request's target is kept. A real
socket and real HTTP, so the client's timeouts, connection errors and parsing meet what they meet in use."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

HANG = "hang"  # keep the connection open, sending nothing more
CLOSE = "close"


@dataclass
class Script:
    events: list[bytes] = field(default_factory=list)
    then: str = CLOSE
    status: int = 200
    body: bytes = b""  # of a non-200 answer


def event(name: str, payload: dict[str, Any]) -> bytes:
    return f"id: {payload['token']}\nevent: {name}\ndata: {json.dumps(payload)}\n\n".encode()


def snapshot(token: str, ping_s: float = 2.0, resources: dict[str, Any] | None = None) -> bytes:
    return event("snapshot", {"token": token, "at": "2026-01-01T00:00:00+00:00", "ping_s": ping_s,
                              "resources": resources or {}, "events": []})


def delta(token: str, changes: list[dict[str, Any]] | None = None) -> bytes:
    return event("delta", {"token": token, "at": "2026-01-01T00:00:01+00:00", "changes": changes or [], "events": []})


class SseServer:
    """Serves `scripts` in order, one per connection (the last one again once they run out)."""

    def __init__(self, scripts: list[Script]):
        self.scripts = scripts
        self.targets: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "SseServer":
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)  # type: ignore[union-attr]
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        self.targets.append(request.split(b" ", 2)[1].decode())
        script = self.scripts[min(len(self.targets) - 1, len(self.scripts) - 1)]
        if script.status != 200:
            writer.write(f"HTTP/1.1 {script.status} Nope\r\ncontent-type: application/json\r\ncontent-length: "
                         f"{len(script.body)}\r\nconnection: close\r\n\r\n".encode() + script.body)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
            for chunk in script.events:
                writer.write(chunk)
        await writer.drain()
        if script.status == 200 and script.then == HANG:
            await self._stop.wait()  # type: ignore[union-attr]
        writer.close()
