"""The two clients of the call table: `ControllerClient` (synchronous, httpx.Client) and
`AsyncControllerClient` (asyncio, httpx.AsyncClient). Each sends a `Call` and parses its reply; an error status
raises the fleetctl.errors class the controller named, and an unreachable or silent controller is Unavailable."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from functools import cache
from typing import Any

import httpx

from fleetctl.client.calls import ControllerCalls
from fleetctl.client.endpoint import Call
from fleetctl.errors import Unavailable, error_from_body
from fleetctl.httpwire import KEEPALIVE_EXPIRY_S  # below uvicorn's 5 s keep-alive (httpx's default is 5 s)

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 10.0


def _body(response: httpx.Response) -> Any:
    """The reply's JSON (its text when it is not JSON); an error status raises the fleetctl.errors class."""
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None if response.status_code >= 400 else response.text
    if response.status_code >= 400:
        raise error_from_body(response.status_code, body)
    return body


def _unreachable(base_url: str, exc: httpx.HTTPError) -> Unavailable:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "unreachable"
    return Unavailable(f"controller at {base_url} {kind} ({type(exc).__name__})")


@cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, made once per process: making one reads the CA bundle (~25 ms), which a
    script or a test that opens many short-lived clients would pay for each."""
    return httpx.create_ssl_context()


def _client_kwargs(base_url: str, token: str | None, timeout: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return {"base_url": base_url.rstrip("/"), "headers": headers, "timeout": timeout,
            "limits": httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S), "verify": _tls_context()}


class ControllerClient(ControllerCalls):
    """Synchronous client (the CLI's). Use as a context manager, or call close()."""

    def __init__(self, base_url: str = DEFAULT_CONTROLLER, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(transport=transport, **_client_kwargs(base_url, token, timeout))

    def __repr__(self) -> str:
        return f"ControllerClient({self.base_url!r})"

    def __enter__(self) -> "ControllerClient":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call) -> Any:
        try:
            response = self._http.request(call.method, call.path, json=call.json, params=call.params, headers=call.headers())
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from None
        return call.parse(_body(response))

    def stream(self, call: Call) -> Iterator[str]:
        """The reply's lines as they arrive; an error status raises as `send` does, at the first `next`."""
        try:
            with self._http.stream(call.method, call.path, params=call.params, headers=call.headers(),
                                   timeout=_stream_timeout(self._http.timeout, call)) as response:
                if response.status_code >= 400:
                    response.read()
                    _body(response)
                yield from response.iter_lines()
        except httpx.ReadTimeout:
            raise _silent(self.base_url, call) from None
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from None

    def watch(self, resume: str | None = None) -> Iterator[Any]:
        """The change stream's messages (watch_contract.WatchMessage), from `resume` when given."""
        from fleetctl.watch_client import watch

        return watch(self, resume)


class AsyncControllerClient(ControllerCalls):
    """Asyncio client (the TUI's, the agent's and the gateway's): the same methods, each awaited."""

    def __init__(self, base_url: str = DEFAULT_CONTROLLER, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(transport=transport, **_client_kwargs(base_url, token, timeout))

    def __repr__(self) -> str:
        return f"AsyncControllerClient({self.base_url!r})"

    async def __aenter__(self) -> "AsyncControllerClient":
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call) -> Any:
        try:
            response = await self._http.request(call.method, call.path, json=call.json, params=call.params,
                                                headers=call.headers())
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from None
        return call.parse(_body(response))

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """The reply's lines as they arrive; an error status raises as `send` does, at the first `anext`."""
        try:
            async with self._http.stream(call.method, call.path, params=call.params, headers=call.headers(),
                                         timeout=_stream_timeout(self._http.timeout, call)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _body(response)
                async for line in response.aiter_lines():
                    yield line
        except httpx.ReadTimeout:
            raise _silent(self.base_url, call) from None
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from None

    def watch(self, resume: str | None = None) -> AsyncIterator[Any]:
        """The change stream's messages (watch_contract.WatchMessage), from `resume` when given."""
        from fleetctl.watch_client import awatch

        return awatch(self, resume)


def _silent(base_url: str, call: Call) -> Unavailable:
    waited = f" for {call.timeout_s:g} s" if call.timeout_s is not None else ""
    return Unavailable(f"controller at {base_url} sent nothing{waited}")


def _stream_timeout(timeout: httpx.Timeout, call: Call) -> httpx.Timeout:
    """The client's timeouts, with the call's longest silence as the read timeout."""
    return timeout if call.timeout_s is None else httpx.Timeout(timeout.connect, read=call.timeout_s,
                                                                write=timeout.write, pool=timeout.pool)
