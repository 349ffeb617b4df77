"""A lean HTTP/1.1 keep-alive client for load generators: JSON in, JSON out, a fixed pool of connections.

Why not httpx: in benchmarks/controller_scale.py the simulated agents share the machine with the controller,
and httpx spent ~2-3 ms of CPU per heartbeat (more than the controller it measured), so the generator, not
the controller, set the ceiling. Real agents each run on their own node, so that cost is not the
controller's. This client does what a keep-alive JSON POST needs and nothing else (no redirects, cookies,
proxies, HTTP/2 or TLS): ~0.1-0.2 ms a request.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class HTTPFailure(Exception):
    """A transport failure or a non-2xx answer (status 0 for transport failures)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


class RawJSONClient:
    def __init__(self, base_url: str, token: str | None, connections: int, timeout_s: float = 30.0):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("http://HOST:PORT only")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s = timeout_s
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._headers = f"Host: {parts.netloc}\r\n{auth}Content-Type: application/json\r\nAccept: application/json\r\n"
        self._idle: asyncio.LifoQueue[_Conn | None] = asyncio.LifoQueue()
        for _ in range(connections):
            self._idle.put_nowait(None)  # a slot; connected on first use

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        payload = json.dumps(body, separators=(",", ":")).encode()
        head = f"POST {path} HTTP/1.1\r\n{self._headers}Content-Length: {len(payload)}\r\n\r\n".encode()
        conn = await self._idle.get()
        try:
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            try:
                status, keep, data = await asyncio.wait_for(self._exchange(conn, head + payload), self.timeout_s)
            except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError):
                if not reused:
                    raise
                # the server closed an idle keep-alive connection as we sent on it (its idle timeout): once more
                # on a new one, as browsers and httpx do
                conn.writer.close()
                conn = await self._connect()
                status, keep, data = await asyncio.wait_for(self._exchange(conn, head + payload), self.timeout_s)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
            if conn is not None:
                conn.writer.close()
            self._idle.put_nowait(None)
            raise HTTPFailure(0, f"{type(exc).__name__}: {exc}") from None
        if keep:
            self._idle.put_nowait(conn)
        else:
            conn.writer.close()
            self._idle.put_nowait(None)
        if not 200 <= status < 300:
            raise HTTPFailure(status, data[:300].decode(errors="replace"))
        return json.loads(data) if data else None

    async def _connect(self) -> _Conn:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Conn(reader, writer)

    async def _exchange(self, conn: _Conn, request: bytes) -> tuple[int, bool, bytes]:
        conn.writer.write(request)
        head = await conn.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            data = await self._read_chunked(conn.reader)
        else:
            data = await conn.reader.readexactly(int(headers.get("content-length", "0")))
        keep = headers.get("connection", "").lower() != "close"
        return status, keep, data

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    async def close(self) -> None:
        while not self._idle.empty():
            conn = self._idle.get_nowait()
            if conn is not None:
                conn.writer.close()
