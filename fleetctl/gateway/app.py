"""The gateway's HTTP app: OpenAI-compatible front door, health, metrics and route explanations.

    POST /v1/completions, /v1/chat/completions   JSON or SSE, routed and admitted (frontdoor.FrontDoor)
    GET  /v1/models                              the routing table's models
    POST /fleet/route/explain                    ranked candidates for a request, nothing sent
    GET  /health                                 200 once a routing table is in hand (its age in the body)
    GET  /metrics                                the gateway's Prometheus metrics (metrics.GatewayMetrics)
    GET, PUT, DELETE /fleet/direct...            direct mode: local flag overrides on the gateway's
                                                 break-glass credential, without the controller (direct.py)

/v1/* and /fleet/* need a client API key when keys are configured (api_keys.KeyRing). Every response
carries `x-request-id` (the client's, or a new one). Errors use OpenAI's shape
{"error": {"message", "type", "param", "code"}}; 429 and 503 carry Retry-After.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from engine.contract.faults import PROBE_HEADER
from engine.protocol import ChatCompletionRequest, CompletionRequest
from fleetctl.client import AsyncControllerClient
from fleetctl.gateway import openapi
from fleetctl.gateway.direct import DirectDisabled, LocalFlags, reason_and_value
from fleetctl.gateway.api_keys import ClientKey, KeyRing, load_key_ring
from fleetctl.gateway.dispatch import RequestContext
from fleetctl.gateway.errors import Forbidden, GatewayError, TooManyRequests
from fleetctl.gateway.frontdoor import FrontDoor, error_response
from fleetctl.gateway.probe_traffic import probe_kind
from fleetctl.gateway.metrics import GatewayMetrics
from fleetctl.gateway.requests import CHAT, COMPLETION
from fleetctl.gateway.routing_table import RoutingSource
from fleetctl.gateway.service import GatewayService
from fleetctl.gateway.settings import GatewaySettings
from fleetctl.gateway.static_table import StaticTableSource, parse_static_engines
from fleetctl.gateway.tokenization import Tokenizers

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_KEY = REQUEST_ID_HEADER.encode()
ENGINE_CONNECTIONS = 1000


def request_id_of(scope: dict) -> str:
    """The client's x-request-id (at most 128 characters), or a new one."""
    for name, value in scope.get("headers") or ():
        if name == _REQUEST_ID_KEY:
            return value.decode("latin-1")[:128] or uuid.uuid4().hex
    return uuid.uuid4().hex


def with_request_id(send: Callable, request_id: str) -> Callable:
    header = (_REQUEST_ID_KEY, request_id.encode("latin-1"))

    async def send_with_id(message: dict) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), header]
        await send(message)

    return send_with_id


class RequestIdMiddleware:
    """Echo the client's x-request-id (or a new one) on every response. Pure ASGI: streaming and
    disconnect detection are untouched."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        await self.app(scope, receive, with_request_id(send, request_id))


class GatewayApp:
    """What uvicorn runs. POST /v1/completions and /v1/chat/completions go straight to their handler;
    everything else, lifespan included, to the FastAPI app. Per request, FastAPI's and Starlette's layers
    (error, telemetry and body-limit middleware, the router, dependency solving) cost about as much CPU as
    routing the request, and the gateway's added latency is mostly its CPU. The two routes stay declared in
    FastAPI (for the OpenAPI schema); requests never reach them. Handlers turn errors into responses
    themselves (`generation`); anything else becomes a logged 500 here."""

    def __init__(self, app: FastAPI, handlers: dict[str, Callable[[Request], Any]]):
        self.app = app
        self.handlers = handlers

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        handler = self.handlers.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        try:
            response = await handler(Request(scope, receive))
        except Exception:
            log.exception("request %s failed", request_id)
            response = error_response(GatewayError("internal gateway error"))
        await response(scope, receive, with_request_id(send, request_id))


def make_source(settings: GatewaySettings, client: httpx.AsyncClient) -> tuple[RoutingSource, Callable[[], Any] | None]:
    """The routing-table source and how to close it."""
    if settings.controller_url:
        controller = AsyncControllerClient(settings.controller_url, settings.controller_token, timeout=5.0)
        return controller, controller.aclose
    return StaticTableSource(parse_static_engines(settings.static_engines), client, settings.static_flags), None


def build_app(settings: GatewaySettings, source: RoutingSource | None = None, keys: KeyRing | None = None,
              tokenizers: Tokenizers | None = None) -> GatewayApp:
    keys = keys if keys is not None else load_key_ring(settings.api_keys_file, settings.api_keys_env)
    metrics = GatewayMetrics()
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=ENGINE_CONNECTIONS, max_keepalive_connections=100)
        client = httpx.AsyncClient(limits=limits, timeout=settings.request_timeout_s)
        table_source, close_source = (source, None) if source is not None else make_source(settings, client)
        service = GatewayService(settings, table_source, client, metrics, tokenizers or Tokenizers(client))
        state["door"] = FrontDoor(service)
        await service.start()
        log.info("gateway listening on %s:%d (%s; %d API key(s))", settings.host, settings.port,
                 f"controller {settings.controller_url}" if settings.controller_url else f"{len(settings.static_engines)} static engine(s)",
                 len(keys))
        try:
            yield
        finally:
            await service.close()
            if close_source is not None:
                await close_source()
            await client.aclose()

    app = FastAPI(title="fleetctl gateway", lifespan=lifespan)
    app.openapi = lambda: app.openapi_schema or _schema_with_bodies(app)

    def door() -> FrontDoor:
        return state["door"]

    def authorize(request: Request, ctx: RequestContext | None = None) -> ClientKey | None:
        if keys.open:
            return None
        key = keys.identify(request.headers.get("authorization"))
        if ctx is not None:
            ctx.key_name = key.name
        try:
            keys.throttle(key)
        except TooManyRequests:
            metrics.rate_limited.labels(key.name).inc()
            raise
        return key

    async def client_key(request: Request) -> str | None:
        key = authorize(request)
        return key.name if key is not None else None

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc)

    async def generation(kind: str, request: Request) -> Response:
        ctx = RequestContext(request.state.request_id)
        try:
            probe = probe_kind(request.headers)
            key = authorize(request, ctx)
            if probe is not None and not keys.may_probe(key):  # a refused one counts as user traffic
                raise Forbidden(f"{PROBE_HEADER} needs a probe key (a key line ending in ':probe'); "
                                f"key {ctx.key_name!r} is not one", param=PROBE_HEADER)
            ctx.probe = probe
        except GatewayError as exc:
            door().finish(ctx, exc.status_code)
            return error_response(exc)
        return await door().generate(kind, request, ctx)

    @app.post("/v1/chat/completions", responses=openapi.GENERATION_ERRORS,
              openapi_extra=openapi.json_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        return await generation(CHAT, request)

    @app.post("/v1/completions", responses=openapi.GENERATION_ERRORS, openapi_extra=openapi.json_body(CompletionRequest))
    async def completions(request: Request) -> Response:
        return await generation(COMPLETION, request)

    app.add_middleware(RequestIdMiddleware)

    @app.get("/v1/models", dependencies=[Depends(client_key)], responses=openapi.errors(401, 503))
    async def models() -> dict[str, Any]:
        table = door().service.require_table()
        created = int(time.time())
        cards = [model_card(name, route, created) for name, route in sorted(table.models.items())]
        return {"object": "list", "data": cards}

    @app.post("/fleet/route/explain", dependencies=[Depends(client_key)], responses=openapi.errors(400, 401, 404, 503),
              openapi_extra=openapi.json_body(ChatCompletionRequest))
    async def explain(request: Request) -> dict[str, Any]:
        return await door().explain(request)

    @app.get("/health", responses={503: {"description": "no routing table yet (the same body, status 503)"},
                                   **openapi.errors()})
    async def health() -> JSONResponse:
        service = door().service
        table = service.table
        body = {
            "status": "ok" if table is not None else "no routing table yet",
            "table_generation": table.generation if table else None,
            "table_age_s": service.cache.age_s(),
            "table_error": service.cache.last_error,
            "engines": {n: {"healthy": e.healthy, "reason": e.down_reason} for n, e in sorted(service.engines.items())},
        }
        return JSONResponse(body, status_code=200 if table is not None else 503)

    def direct_mode(request: Request) -> LocalFlags:
        flags = door().service.direct
        if flags is None:
            raise DirectDisabled("direct mode is off on this gateway (start it with --state-dir)")
        flags.authorize(request.headers.get("authorization"))
        return flags

    def client_of(request: Request) -> str | None:
        return request.client.host if request.client else None

    @app.get("/fleet/direct", responses=openapi.errors(401, 404))
    async def direct_state(request: Request) -> dict[str, Any]:
        return {"name": settings.name, **direct_mode(request).state(door().service.table)}

    @app.put("/fleet/direct/flags/{key}", responses=openapi.errors(400, 401, 404))
    async def direct_set(key: str, request: Request) -> dict[str, Any]:
        flags = direct_mode(request)
        value, reason = await reason_and_value(request, need_value=True)
        entry = flags.set(key, value, door().service.cache.fetched, reason, client_of(request))
        door().service.cache.reapply()
        return {"name": settings.name, "key": key, "value": entry.value, "seq": entry.seq, "local": True}

    @app.delete("/fleet/direct/flags/{key}", responses=openapi.errors(400, 401, 404))
    async def direct_unset(key: str, request: Request) -> dict[str, Any]:
        flags = direct_mode(request)
        _value, reason = await reason_and_value(request, need_value=False)
        entry = flags.unset(key, reason, client_of(request))
        door().service.cache.reapply()
        return {"name": settings.name, "key": key, "value": None, "seq": entry.seq, "local": False}

    @app.post("/fleet/direct/rotate", responses=openapi.errors(401, 404))
    async def direct_rotate(request: Request) -> dict[str, Any]:
        return {"name": settings.name, "credential": direct_mode(request).rotate()}

    @app.get("/metrics", responses=openapi.errors())
    async def metrics_route() -> Response:
        door().service.refresh_gauges()
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return GatewayApp(app, {"/v1/chat/completions": chat_completions, "/v1/completions": completions})


def _schema_with_bodies(app: FastAPI) -> dict[str, Any]:
    from fastapi.openapi.utils import get_openapi

    app.openapi_schema = openapi.add_body_schemas(get_openapi(title=app.title, version=app.version, routes=app.routes))
    return app.openapi_schema


def model_card(name: str, route: Any, created: int) -> dict[str, Any]:
    windows = [spec.max_model_len for ref, spec in route.classes.items() if route.traffic.get(ref, 0) > 0]
    return {"id": name, "object": "model", "created": created, "owned_by": "fleetctl", "root": name, "parent": None,
            "max_model_len": max(windows) if windows else None, "permission": []}
