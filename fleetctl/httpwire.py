"""A lean HTTP/1.1 client on kept-alive connections, for the hot paths where httpx costs too much CPU: the
gateway's request path to engines (its main user) and the controller benchmark's simulated agents. It
imports nothing of fleetctl, so any part may use it.

Why not httpx here: the gateway's added latency is its CPU per request, and per streamed request httpx,
httpcore and anyio cost about 0.9 ms of the gateway's ~3 ms (py-spy, benchmarks/routing.py's latency phase):
request and URL models, a connection pool behind anyio locks, h11 in pure Python, a cancel scope per read.
Engines are HTTP/1.1 servers we know (the reference engine, vLLM: both uvicorn), so the gateway needs a
POST with a JSON body (or a GET) on a kept-alive connection and a body that comes with Content-Length or chunked. This
does that on an asyncio Protocol with httptools' C parser (the one uvicorn uses). The gateway's engine probes
(GET /health and /metrics every second per engine) use it too; what talks to anything other than an engine
(the controller, tokenizer downloads) keeps using httpx.

- `EngineClient.request(...)` returns once the status line and headers are in; the body is read with
  `read()` or streamed with `chunks()`; `aclose()` puts the connection back in the pool if the body was
  read to its end and the engine keeps the connection alive, and closes it otherwise (which tells the
  engine the client went away: it aborts the request).
- Idle connections are dropped after `idle_expiry_s`, below uvicorn's 5 s keep-alive, so the gateway rarely
  sends on a connection the engine is closing. When that happens anyway (a reused connection dies before any
  byte of the answer came back) the request is sent once more on a new connection: the engine never saw it.
- Failures are `EngineConnectError` (could not connect), `EngineDisconnected` (the connection ended or
  broke before the answer did) and `EngineProtocolError` (not HTTP/1.1 as we know it); timeouts are the
  caller's `asyncio.wait_for`, as everywhere in upstream.py.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httptools

# Idle kept-alive connections are dropped before uvicorn's 5 s keep-alive closes them (engines, vLLM and the
# controller all serve with uvicorn): a request sent just as the server closes its end fails without an answer.
KEEPALIVE_EXPIRY_S = 4.0
MAX_IDLE_PER_ENGINE = 64
_PAUSE_ABOVE = 256 * 1024  # buffered body bytes before the socket stops being read (back-pressure)


class EngineHTTPError(Exception):
    pass


class EngineConnectError(EngineHTTPError):
    pass


class EngineDisconnected(EngineHTTPError):
    pass


class EngineProtocolError(EngineHTTPError):
    pass


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; one request at a time. The parser's callbacks fill `response`."""

    def __init__(self, key: tuple[str, str, int]):
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: EngineResponse | None = None
        self.closed = False
        self.idle_since = 0.0

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.response._fail(EngineProtocolError(f"bad HTTP from the engine: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response.complete:
            if response.headers_done and response.until_close:
                response._finish()  # a body delimited by the connection's end
            else:
                why = f"{type(exc).__name__}: {exc}" if exc else "the engine closed the connection"
                response._fail(EngineDisconnected(why))

    def pause_writing(self) -> None:  # request bodies are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks ---

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.response is not None
        self.response._headers_complete(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._body(body)
        if self.response._buffered > _PAUSE_ABOVE and self.transport is not None:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        assert self.response is not None
        self.response.keep_alive = self.parser.should_keep_alive()
        self.response._finish()

    # --- use ---

    def send(self, head: bytes, body: bytes, response: "EngineResponse") -> None:
        assert self.transport is not None
        self.response = response
        self.parser = httptools.HttpResponseParser(self)
        self.transport.write(head + body)

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class EngineResponse:
    """An engine's answer: status and headers once `EngineClient.request` returns, then the body."""

    def __init__(self, client: "EngineClient", connection: _Connection):
        self._client = client
        self._connection = connection
        self.status = 0
        self.headers: dict[str, str] = {}  # lower-case names
        self.headers_done = False
        self.until_close = False  # neither Content-Length nor chunked: the body ends with the connection
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False  # any byte of the answer arrived (a failure after that is not retried)
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._error: EngineHTTPError | None = None
        self._waiter: asyncio.Future | None = None
        self._released = False

    # --- fed by the connection ---

    def _headers_complete(self, status: int) -> None:
        self.got_bytes = True
        self.status = status
        for name, value in self._raw_headers:
            self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        encoding = self.headers.get("transfer-encoding", "").lower()
        self.until_close = "content-length" not in self.headers and "chunked" not in encoding
        self.headers_done = True
        self._wake()

    def _body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: EngineHTTPError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _resolve(waiter, None)

    # --- read ---

    async def _wait_headers(self) -> None:
        while not self.headers_done:
            self.raise_if_failed()
            await self.wait_for_data(None)  # the headers wake it too

    def take_buffered(self) -> bytes:
        """The body bytes that arrived and were not read yet (b"" if none), without waiting."""
        if not self._chunks:
            return b""
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        self._connection.resume()
        return data

    def raise_if_failed(self) -> None:
        if self._error is not None and not self._chunks:
            raise self._error

    async def wait_for_data(self, timeout_s: float | None) -> bool:
        """Wait until more body arrives, the body ends or the connection fails; False if timeout_s passed
        first. Nothing is cancelled on a timeout: what arrives meanwhile waits in the buffer."""
        if self._chunks or self.complete or self._error is not None:
            return True
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        if timeout_s is None:
            await waiter
            return True
        timer = loop.call_later(timeout_s, _resolve, waiter, False)
        try:
            return await waiter is not False
        finally:
            timer.cancel()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; EngineDisconnected if the connection breaks before its end."""
        while True:
            data = self.take_buffered()
            if data:
                yield data
            elif self.complete:
                return
            else:
                self.raise_if_failed()
                await self.wait_for_data(None)

    async def read(self) -> bytes:
        return b"".join([data async for data in self.chunks()])

    async def aclose(self) -> None:
        """Back to the pool if the whole body was read and the engine keeps the connection; else closed."""
        if self._released:
            return
        self._released = True
        connection = self._connection
        connection.response = None
        if self.complete and self.keep_alive and not self._chunks and self._error is None and not connection.closed:
            self._client._release(connection)
        else:
            connection.close()


def _resolve(waiter: asyncio.Future, value: object) -> None:
    if not waiter.done():
        waiter.set_result(value)


class EngineClient:
    """Kept-alive connections to engines, per (scheme, host, port)."""

    def __init__(self, idle_expiry_s: float = KEEPALIVE_EXPIRY_S, max_idle_per_engine: int = MAX_IDLE_PER_ENGINE,
                 ssl_context: ssl.SSLContext | None = None):
        self.idle_expiry_s = idle_expiry_s
        self.max_idle_per_engine = max_idle_per_engine
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._closed = False

    async def request(self, method: str, url: str, body: bytes, headers: Mapping[str, str],
                      connect_timeout_s: float) -> EngineResponse:
        """Send the request; the response once its headers are in (the caller times the whole call out)."""
        key, target = _split(url)
        head = _request_head(method, target, key, headers, len(body))
        while True:
            connection = self._take_idle(key)
            reused = connection is not None
            if connection is None:
                connection = await self._connect(key, connect_timeout_s)
            response = EngineResponse(self, connection)
            try:
                connection.send(head, body, response)
                await response._wait_headers()
                return response
            except EngineDisconnected:
                connection.close()
                if reused and not response.got_bytes:
                    continue  # the engine closed the idle connection as we sent: it never saw the request
                raise
            except BaseException:
                connection.close()  # cancelled or timed out: the engine must see the client go
                raise

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()  # most recent first: the likeliest to be alive
            if not connection.closed and now - connection.idle_since < self.idle_expiry_s:
                return connection
            connection.close()
        return None

    def _release(self, connection: _Connection) -> None:
        if self._closed:
            connection.close()
            return
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= self.max_idle_per_engine:
            idle.pop(0).close()
        connection.idle_since = asyncio.get_running_loop().time()
        idle.append(connection)

    async def _connect(self, key: tuple[str, str, int], timeout_s: float) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        context = None
        if scheme == "https":
            context = self._ssl_context or ssl.create_default_context()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(key), host, port, ssl=context), timeout_s)
        except asyncio.TimeoutError:
            raise EngineConnectError(f"no connection to {host}:{port} within {timeout_s:g}s") from None
        except OSError as exc:
            raise EngineConnectError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        return connection

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


def _split(url: str) -> tuple[tuple[str, str, int], str]:
    """(scheme, host, port) and the request target of an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineProtocolError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (parts.scheme, parts.hostname, port), target


def _request_head(method: str, target: str, key: tuple[str, str, int], headers: Mapping[str, str], length: int) -> bytes:
    scheme, host, port = key
    default_port = 443 if scheme == "https" else 80
    authority = f"[{host}]" if ":" in host else host
    if port != default_port:
        authority += f":{port}"
    lines = [f"{method} {target} HTTP/1.1", f"host: {authority}", f"content-length: {length}"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise EngineProtocolError(f"header {name!r} holds a line break")  # never split a request in two
        if name.lower() not in ("host", "content-length"):
            lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
