"""The call table's machinery: a route is an `Endpoint` (method, path template, response model, and a builder
that turns a method's arguments into a `Request`); on a client it becomes a method that sends the built `Call`
through the client's `send` (or `stream`). fleetctl/client/calls*.py declare the routes with `endpoint`."""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError

from fleetctl.errors import FleetError

REASON_HEADER = "X-Fleet-Reason"
IF_MATCH_HEADER = "If-Match"

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Request:
    """What a builder makes of a method's arguments: path parameters, JSON body, query, audit reason, and
    the version a change expects (sent as If-Match)."""

    path: dict[str, str] = field(default_factory=dict)
    json: Any = None
    params: dict[str, Any] | None = None
    reason: str | None = None
    if_match: int | None = None
    timeout_s: float | None = None  # streams: the longest wait for the next bytes (default the client's timeout)


@dataclass(frozen=True)
class Call:
    """One API request, built the same way for the sync and the async client, and how to read its reply."""

    method: str
    path: str
    response: TypeAdapter[Any]
    json: Any = None
    params: dict[str, Any] | None = None
    reason: str | None = None
    if_match: int | None = None
    timeout_s: float | None = None

    def headers(self) -> dict[str, str]:
        headers = {REASON_HEADER: quote(self.reason)} if self.reason else {}
        if self.if_match is not None:
            headers[IF_MATCH_HEADER] = f'"{self.if_match}"'
        return headers

    def parse(self, body: Any) -> Any:
        try:
            return self.response.validate_python(body)
        except ValidationError as exc:
            raise FleetError(f"controller sent an unexpected reply to {self.method} {self.path}: "
                             f"{exc.error_count()} field(s) do not parse, first: {_first_error(exc)}") from None


class Endpoint(Generic[P, R]):
    """One route of the call table. On a client instance it is a method that sends the built Call through
    the client's `send`: a value on ControllerClient, an awaitable on AsyncControllerClient."""

    def __init__(self, method: str, path: str, response: Any, build: Callable[P, Request]):
        self.method, self.path, self.build = method, path, build
        self.response_type = response
        self.adapter: TypeAdapter[Any] = TypeAdapter(response)
        self.name = build.__name__
        self.path_fields = tuple(name for _, name, _, _ in string.Formatter().parse(path) if name)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Call:
        request = self.build(*args, **kwargs)
        path = self.path.format(**{key: quote(str(value), safe="") for key, value in request.path.items()})
        return Call(self.method, path, self.adapter, request.json, request.params, request.reason, request.if_match,
                    request.timeout_s)

    def __get__(self, client: Any, owner: type | None = None) -> Any:
        if client is None:
            return self

        @functools.wraps(self.build)
        def method(*args: Any, **kwargs: Any) -> Any:
            return client.send(self.call(*args, **kwargs))

        method.__annotations__ = {**self.build.__annotations__, "return": self.response_type}
        return method


class StreamEndpoint(Endpoint[P, R]):
    """A route whose reply is a stream: on a client instance, a method that returns the client's
    `stream(call)`, the reply's lines as they arrive (an iterator; an async iterator on the async client)."""

    def __get__(self, client: Any, owner: type | None = None) -> Any:
        if client is None:
            return self

        @functools.wraps(self.build)
        def method(*args: Any, **kwargs: Any) -> Any:
            return client.stream(self.call(*args, **kwargs))

        return method


def endpoint(method: str, path: str, response: Any) -> Callable[[Callable[P, Request]], Endpoint[P, Any]]:
    """Declare a builder as the call of `method path`, whose reply parses as `response`."""
    return lambda build: Endpoint(method, path, response, build)


def stream_endpoint(method: str, path: str) -> Callable[[Callable[P, Request]], Endpoint[P, Any]]:
    """Declare a builder as the call of a streaming `method path` (its reply: text lines)."""
    return lambda build: StreamEndpoint(method, path, str, build)


def params_of(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}



def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(part) for part in error['loc']) or '(body)'}: {error['msg']}"

