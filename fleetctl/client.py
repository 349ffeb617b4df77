"""The typed HTTP client of the controller API: the only module that talks HTTP to the controller.

Used by the CLI, the TUI, the agent and the gateway. Every controller route is one `Endpoint` in
`ControllerCalls`, the call table: its method, path template, response model and a builder that turns the
method's arguments into a request. `ControllerClient` (synchronous, httpx.Client) and
`AsyncControllerClient` (asyncio, httpx.AsyncClient) both inherit the table, so they have the same methods
with the same arguments; the async ones return awaitables. Replies are parsed into the response models of
fleetctl/controller/responses.py (lists of models for lists, dicts of models for maps).

`GET /api/v1/watch` is a stream: its call-table entry (`watch_stream`) yields the reply's lines as they
arrive (`stream`); `watch()` parses them into the change stream's messages (fleetctl/watch_client.py, which
also reconnects: `follow`).

Errors are raised as fleetctl.errors: NotFound, AuthError, Conflict, ValidationFailed (422/413),
Unavailable (503, connection refused, timeout), else FleetError (also for a reply that does not parse).
The token is sent as a bearer header and never appears in messages or reprs.

    client = ControllerClient("http://127.0.0.1:8080", token)
    client.apply_class("chat", {"model": "smollm2-135m", "weights": "smollm2"}, reason="new class").ref
"""

from __future__ import annotations

import functools
import string
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter, ValidationError

from fleetctl.controller.responses import (
    AuditEventView, CanaryClassView, CanaryEventView, CanaryStreamView, ClassApplied, ClassHistoryEntry, ClassRevisionView, ClassSummary, DeploymentDeleted,
    DeploymentSetResult, DeploymentView, DrillStarted, DrillStopResult, DrillView, EngineChange, EngineDrift, EngineView, FlagSetResult, FlagView, FleetStatus, GatewayView,
    Health, HeartbeatResponse, NodeChange, NodeDetail, NodeView, RegisterResponse, RoutingTable, TokenCreated,
    TokenRevoked, TokenView, TrafficPolicyView, TrafficSetResult, TrafficView, WhoAmI,
)
from fleetctl.controller.responses import GoldenSetStored, GoldenSetSummary, ReferenceSummary
from fleetctl.controller.rollout.view import RolloutEventView, RolloutView
from fleetctl.errors import FleetError, Unavailable, error_from_body
from fleetctl.httpwire import KEEPALIVE_EXPIRY_S  # below uvicorn's 5 s keep-alive (httpx's default is 5 s)

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 10.0
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


def _params(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


class ControllerCalls:
    """The call table: each controller route once. Both clients inherit it; `endpoints()` lists it.

    The builders take no `self`: `endpoint` turns each into an Endpoint, which binds to the client."""

    @classmethod
    def endpoints(cls) -> list[Endpoint[Any, Any]]:
        return [value for klass in cls.__mro__ for value in vars(klass).values() if isinstance(value, Endpoint)]

    # agents and gateways
    @endpoint("POST", "/api/v1/agents/register", RegisterResponse)
    def register_agent(payload: dict[str, Any]) -> Request:
        return Request(json=payload)

    @endpoint("POST", "/api/v1/agents/heartbeat", HeartbeatResponse)
    def heartbeat(payload: dict[str, Any]) -> Request:
        return Request(json=payload)

    @endpoint("GET", "/api/v1/routing", RoutingTable)
    def routing() -> Request:
        return Request()

    @endpoint("POST", "/api/v1/gateways/report", GatewayView)
    def report_gateway(payload: dict[str, Any]) -> Request:
        """{name, url?, generation, table_age_s, refresh_interval_s?}: the routing table a gateway applied."""
        return Request(json=payload)

    @endpoint("GET", "/api/v1/gateways", list[GatewayView])
    def list_gateways() -> Request:
        """Each gateway's last report: generation, last_seen, seen_ago_s, stale."""
        return Request()

    # fleet
    @endpoint("GET", "/healthz", Health)
    def health() -> Request:
        return Request()

    @endpoint("GET", "/metrics", str)
    def metrics() -> Request:
        """The controller's Prometheus metrics, in the text exposition format."""
        return Request()

    @endpoint("GET", "/api/v1/status", FleetStatus)
    def status() -> Request:
        return Request()

    @stream_endpoint("GET", "/api/v1/watch")
    def watch_stream(resume: str | None = None, silence_s: float | None = None) -> Request:
        """The change stream's SSE lines (parsed by fleetctl.watch_client: use `watch()` or `follow`); from
        `resume` (a token seen) when given. `silence_s`: seconds without a byte that end it (Unavailable)."""
        return Request(params=_params(resume=resume), timeout_s=silence_s)

    @endpoint("GET", "/api/v1/whoami", WhoAmI)
    def whoami() -> Request:
        """The calling token's name and role."""
        return Request()

    @endpoint("GET", "/api/v1/drift", list[EngineDrift])
    def live_drift(model: str | None = None) -> Request:
        """Each running engine (of `model`) against its class revision: every difference, and its sources."""
        return Request(params=_params(model=model))

    @endpoint("GET", "/api/v1/nodes", list[NodeView])
    def list_nodes() -> Request:
        return Request()

    @endpoint("GET", "/api/v1/nodes/{name}", NodeDetail)
    def get_node(name: str) -> Request:
        return Request(path={"name": name})

    @endpoint("POST", "/api/v1/nodes/{name}/cordon", NodeChange)
    def cordon_node(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    @endpoint("POST", "/api/v1/nodes/{name}/uncordon", NodeChange)
    def uncordon_node(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    @endpoint("POST", "/api/v1/nodes/{name}/drain", NodeChange)
    def drain_node(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    @endpoint("GET", "/api/v1/engines", list[EngineView])
    def list_engines(node: str | None = None) -> Request:
        return Request(params=_params(node=node))

    @endpoint("GET", "/api/v1/engines/{name}", EngineView)
    def get_engine(name: str) -> Request:
        return Request(path={"name": name})

    @endpoint("POST", "/api/v1/engines/{name}/drain", EngineChange)
    def drain_engine(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    # replica classes
    @endpoint("POST", "/api/v1/classes", ClassApplied)
    def apply_class(name: str, spec: dict[str, Any], reason: str | None = None) -> Request:
        """The revision; `result` is "created" (201) or "unchanged" (identical content, 200)."""
        return Request(json={"name": name, "spec": spec}, reason=reason)

    @endpoint("GET", "/api/v1/classes/{ref}", ClassRevisionView)
    def get_class(ref: str) -> Request:
        return Request(path={"ref": ref})

    @endpoint("GET", "/api/v1/classes", list[ClassSummary])
    def list_classes() -> Request:
        return Request()

    @endpoint("GET", "/api/v1/classes/{name}/history", list[ClassHistoryEntry])
    def class_history(name: str) -> Request:
        return Request(path={"name": name})

    # deployments
    @endpoint("PUT", "/api/v1/deployments/{name}", DeploymentSetResult)
    def set_deployment(name: str, class_ref: str, replicas: int, role: str = "mixed",
                       placement: dict[str, str] | None = None, model: str | None = None,
                       reason: str | None = None) -> Request:
        body: dict[str, Any] = {"class_ref": class_ref, "replicas": replicas, "role": role, "placement": placement or {}}
        if model is not None:
            body["model"] = model
        return Request(path={"name": name}, json=body, reason=reason)

    @endpoint("GET", "/api/v1/deployments", list[DeploymentView])
    def list_deployments() -> Request:
        return Request()

    @endpoint("GET", "/api/v1/deployments/{name}", DeploymentView)
    def get_deployment(name: str) -> Request:
        return Request(path={"name": name})

    @endpoint("DELETE", "/api/v1/deployments/{name}", DeploymentDeleted)
    def delete_deployment(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    # traffic and flags
    @endpoint("GET", "/api/v1/traffic", dict[str, TrafficPolicyView])
    def list_traffic() -> Request:
        return Request()

    @endpoint("GET", "/api/v1/traffic/{model}", TrafficView)
    def get_traffic(model: str) -> Request:
        """The model's weights and, per revision, ready engines and correctness fields."""
        return Request(path={"model": model})

    @endpoint("PUT", "/api/v1/traffic/{model}", TrafficSetResult)
    def set_traffic(model: str, weights: dict[str, float], allow_correctness_change: bool = False,
                    reason: str | None = None) -> Request:
        """Stored weights and the routing `generation` that includes them. A split over revisions whose
        correctness fields differ is a Conflict (`correctness_split_refused`) unless allowed."""
        body = {"weights": weights, "allow_correctness_change": allow_correctness_change}
        return Request(path={"model": model}, json=body, reason=reason)

    @endpoint("GET", "/api/v1/flags", dict[str, FlagView])
    def list_flags() -> Request:
        return Request()

    @endpoint("PUT", "/api/v1/flags/{name}", FlagSetResult)
    def set_flag(name: str, value: bool | int | float | str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, json={"value": value}, reason=reason)

    # rollouts
    @endpoint("POST", "/api/v1/rollouts", RolloutView)
    def start_rollout(spec: dict[str, Any], reason: str | None = None) -> Request:
        """Store a rollout (the spec as YAML would hold it, aliases as written); a bad spec is a
        ValidationFailed naming the field (`spec.steps.1.setWeight`), a second one for the model a Conflict
        (`rollout_in_progress`)."""
        return Request(json={"spec": spec}, reason=reason)

    @endpoint("GET", "/api/v1/rollouts", list[RolloutView])
    def list_rollouts(model: str | None = None, active: bool | None = None) -> Request:
        """Oldest first; `active`: only rollouts that are not completed or aborted."""
        return Request(params=_params(model=model, active=None if active is None else str(active).lower()))

    @endpoint("GET", "/api/v1/rollouts/{rollout_id}", RolloutView)
    def get_rollout(rollout_id: int) -> Request:
        return Request(path={"rollout_id": str(rollout_id)})

    @endpoint("POST", "/api/v1/rollouts/{rollout_id}/{command}", RolloutView)
    def rollout_command(rollout_id: int, command: str, full: bool = False, reason: str | None = None,
                        version: int | None = None) -> Request:
        """pause | resume | promote (`full`) | abort | retry: the rollout after it; undo: the new rollout.
        `version` is sent as If-Match (a Conflict `version_conflict` when the rollout moved on)."""
        body = {"full": True} if full else None
        return Request(path={"rollout_id": str(rollout_id), "command": command}, json=body, reason=reason,
                       if_match=version)

    @endpoint("GET", "/api/v1/rollouts/{rollout_id}/history", list[RolloutEventView])
    def rollout_history(rollout_id: int) -> Request:
        return Request(path={"rollout_id": str(rollout_id)})

    # the quality canary
    @endpoint("GET", "/api/v1/canary/status", list[CanaryStreamView])
    def canary_status(model: str | None = None) -> Request:
        """Each canary stream's verdict and evidence (of `model`)."""
        return Request(params=_params(model=model))

    @endpoint("GET", "/api/v1/canary/classes/{ref}", CanaryClassView)
    def canary_class(ref: str, limit: int | None = None) -> Request:
        """A class revision's streams and the latest `limit` probes it served."""
        return Request(path={"ref": ref}, params=_params(limit=limit))

    @endpoint("GET", "/api/v1/canary/events", list[CanaryEventView])
    def canary_events(model: str | None = None, limit: int | None = None) -> Request:
        """Verdict changes (alerts, recoveries), oldest first."""
        return Request(params=_params(model=model, limit=limit))

    # canary drills
    @endpoint("POST", "/api/v1/drills/misroute", DrillStarted)
    def start_misroute_drill(model: str, to: str, fraction: float, duration_s: float | None = None,
                             reason: str | None = None) -> Request:
        """Send `fraction` (0 < f <= 0.5) of `model`'s traffic to the revision `to` for `duration_s` (default
        20 minutes, at most 4 hours); a Conflict (`drill_in_progress`) when the model has a drill in effect."""
        return Request(json={"model": model, "to": to, "fraction": fraction, "duration_s": duration_s}, reason=reason)

    @endpoint("POST", "/api/v1/drills/plant", DrillStarted)
    def start_plant_drill(engine: str, fault: str, duration_s: float | None = None,
                          reason: str | None = None) -> Request:
        """Restart the running `engine` with the hidden `fault` (engine.contract.faults) for `duration_s`."""
        return Request(json={"engine": engine, "fault": fault, "duration_s": duration_s}, reason=reason)

    @endpoint("GET", "/api/v1/drills", list[DrillView])
    def list_drills() -> Request:
        """The drills in effect (oldest first), then the last 50 that ended (newest first)."""
        return Request()

    @endpoint("POST", "/api/v1/drills/{drill_id}/stop", DrillStopResult)
    def stop_drill(drill_id: int, reason: str | None = None) -> Request:
        return Request(path={"drill_id": str(drill_id)}, reason=reason)

    @endpoint("POST", "/api/v1/drills/stop", DrillStopResult)
    def stop_all_drills(reason: str | None = None) -> Request:
        """End every drill in effect."""
        return Request(reason=reason)

    # the quality canary: golden sets and references
    @endpoint("POST", "/api/v1/canary/golden-sets", GoldenSetStored)
    def put_golden_set(golden_set: dict[str, Any], reason: str | None = None) -> Request:
        """Store a golden set (as its file holds it); `result` is "unchanged" for the identical set. A bad set
        is a ValidationFailed naming the entry; other content under a stored version a Conflict naming `version`."""
        return Request(json={"golden_set": golden_set}, reason=reason)

    @endpoint("GET", "/api/v1/canary/golden-sets", list[GoldenSetSummary])
    def list_golden_sets() -> Request:
        return Request()

    @endpoint("POST", "/api/v1/canary/references", ReferenceSummary)
    def put_reference(reference: dict[str, Any], reason: str | None = None) -> Request:
        """Store a recorded reference (canary.types.Reference as JSON); its golden set must be stored first."""
        return Request(json={"reference": reference}, reason=reason)

    @endpoint("GET", "/api/v1/canary/references", list[ReferenceSummary])
    def list_references(model: str | None = None) -> Request:
        """Oldest first; summaries (prompts, noise per batch condition, expected answers), not the bodies."""
        return Request(params=_params(model=model))

    # audit and tokens
    @endpoint("GET", "/api/v1/audit", list[AuditEventView])
    def list_audit(since: str | None = None, actor: str | None = None, limit: int | None = None) -> Request:
        return Request(params=_params(since=since, actor=actor, limit=limit))

    @endpoint("POST", "/api/v1/tokens", TokenCreated)
    def create_token(name: str, role: str, reason: str | None = None) -> Request:
        """The new token is in `token`; it is shown only here."""
        return Request(json={"name": name, "role": role}, reason=reason)

    @endpoint("GET", "/api/v1/tokens", list[TokenView])
    def list_tokens() -> Request:
        return Request()

    @endpoint("DELETE", "/api/v1/tokens/{name}", TokenRevoked)
    def revoke_token(name: str, reason: str | None = None, force: bool = False) -> Request:
        """`force`: even the last active admin token, or the one this client uses (refused with 409 otherwise)."""
        return Request(path={"name": name}, reason=reason, params={"force": "true"} if force else None)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(part) for part in error['loc']) or '(body)'}: {error['msg']}"


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


def _client_kwargs(base_url: str, token: str | None, timeout: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return {"base_url": base_url.rstrip("/"), "headers": headers, "timeout": timeout,
            "limits": httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)}


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


__all__ = ["AsyncControllerClient", "Call", "ControllerCalls", "ControllerClient", "Endpoint", "FleetError",
           "DEFAULT_CONTROLLER", "Request"]
