"""The reference engine's HTTP API: OpenAI-compatible endpoints, vLLM's extras, /metrics, P/D K/V transfer.

`build_app(engine, config)` wires a started engine (anything with engine.reference.engine_port's
`EnginePort`: `AsyncEngine` in production) into a FastAPI app:
- /v1/completions, /v1/chat/completions: validated here, answered by engine.reference.server_generation (JSON
  or SSE). P/D: `kv_transfer_params.do_remote_decode` holds (and optionally pushes) the prompt's blocks and
  returns kv_transfer_params; `do_remote_prefill` loads them (engine.reference.kv_transfer).
- /v1/models, /v1/fleet/config (effective settings), /health, /tokenize, /detokenize, /reset_prefix_cache, /metrics, /drain, /kv/{pull,push,release}.
- Every error is an OpenAI-style body {"error": {"message", "type", "param", "code"}}: engine.errors render
  themselves; pydantic validation errors become 400 naming the field (not FastAPI's 422), as in vLLM.
- Draining (engine.reference.server_lifecycle): /health and new /v1 requests answer 503 with Retry-After,
  in-flight requests get drain_grace_s to finish, then `on_exit` is called to stop the process.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from engine import protocol
from engine.errors import EngineError, InvalidRequest, Unauthorized, openapi_error_responses
from engine.protocol import ChatCompletionRequest, CompletionRequest
from engine.reference.config import EngineConfig
from engine.reference.config_report import effective_config
from engine.reference.engine_port import EnginePort
from engine.reference.kv_event_publisher import KVEventPublisher
from engine.reference.kv_tier_client import KVTierLink
from engine.reference.kv_tier_events import TierEventRelay
from engine.reference.kv_tier_peer import peer_router
from engine.reference.kv_transfer import KVTransfer
from engine.reference.metrics import CacheInfo, EngineMetrics
from engine.reference.server_generation import Generation
from engine.reference.server_lifecycle import RETRY_AFTER_S, Lifecycle

log = logging.getLogger(__name__)


# --- the app ------------------------------------------------------------------------------------------


class Serving:
    """Everything the routes share: the engine, its settings, metrics, P/D transfer, the lifecycle."""

    def __init__(self, engine: EnginePort, config: EngineConfig, on_exit: Callable[[], None] | None):
        self.engine = engine
        self.config = config
        self.model_name = config.served_model_name
        self.metrics = EngineMetrics(
            model_name=self.model_name,
            max_model_len=config.max_model_len,
            cache=CacheInfo(
                block_size=engine.block_size,
                num_gpu_blocks=engine.num_blocks,
                enable_prefix_caching=config.enable_prefix_caching,
                cache_dtype=config.kv_cache_dtype,
                max_model_len=config.max_model_len,
                kv_cache_mib=config.kv_cache_mib,
            ),
        )
        self.kv = KVTransfer(
            engine, self.metrics, block_size=engine.block_size, timeout_s=config.kv_transfer_timeout_s,
            failure_policy=config.kv_load_failure_policy, api_key=config.api_key,
            side_channel=(config.host, config.kv_side_channel_port) if config.kv_side_channel_port >= 0 else None,
            prewarm_bytes=_largest_frame(engine, config) if config.role != "mixed" else 0,
        )
        self.publisher = _make_publisher(config)
        self.tier = KVTierLink(engine, config, lambda: self.kv.client) if config.kv_tier_url else None
        if self.tier is not None:
            self.metrics.registry.register(self.tier)
        self.tier_events = None  # the node tier's blocks on this engine's KV event stream
        if self.tier is not None and self.publisher is not None:
            self.tier_events = TierEventRelay(config.kv_tier_url, self.tier.layout, token=self.tier.token,
                                              publish=self.publisher.publish, client=lambda: self.kv.client)
        self.lifecycle = Lifecycle(config.drain_grace_s, on_exit)
        engine.add_step_listener(self.metrics.on_step)
        if self.publisher is not None:
            engine.add_step_listener(self.publisher.on_step)

    def begin_drain(self) -> None:
        """Stop taking requests; exit once in-flight ones finish and held K/V is pulled (or the grace ends)."""
        self.lifecycle.start_drain(wait_also=lambda: len(self.kv.held) > 0)

    def token_text(self, token_id: int) -> str:
        return self.engine.tokenizer.decode([token_id])

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        tokenizer = self.engine.tokenizer
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)

    def text_prompt(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            return self.engine.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        return list(prompt)


def _largest_frame(engine: EnginePort, config: EngineConfig) -> int:
    """A P/D engine keeps a frame buffer this large ready, so its first transfer pays no page faults."""
    return config.max_model_len * engine.bytes_per_block // engine.block_size


def _make_publisher(config: EngineConfig) -> KVEventPublisher | None:
    if not config.kv_events_endpoint:
        return None
    return KVEventPublisher(config.kv_events_endpoint, config.kv_events_replay_endpoint, config.kv_events_topic)


def build_app(engine: EnginePort, config: EngineConfig, on_exit: Callable[[], None] | None = None) -> FastAPI:
    """The HTTP app for a started engine. `on_exit` is called when a drain completes (the process should stop)."""
    serving = Serving(engine, config, on_exit)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if serving.publisher is not None:
            serving.publisher.start()
        await serving.kv.start()
        if serving.tier is not None:
            serving.tier.start()
        if serving.tier_events is not None:
            serving.tier_events.start()
        try:
            yield
        finally:
            if serving.tier_events is not None:
                await serving.tier_events.aclose()
            if serving.tier is not None:
                await serving.tier.aclose()
            await serving.kv.aclose()
            if serving.publisher is not None:
                serving.publisher.shutdown()

    app = FastAPI(title="fleetctl reference engine", lifespan=lifespan)
    app.state.serving = serving
    app.add_middleware(RequestIdMiddleware)
    _add_error_handlers(app)
    auth = _auth_dependency(config.api_key)
    refuse_while_draining = Depends(serving.lifecycle.refuse_while_draining)
    app.include_router(_openai_router(serving), dependencies=[Depends(auth), refuse_while_draining])
    app.include_router(serving.kv.router(auth))
    if serving.tier is not None:
        app.include_router(peer_router(serving.tier, auth))
    app.include_router(_admin_router(serving, auth))
    return app


class RequestIdMiddleware:
    """Echo the client's x-request-id (or a new one) on every response; a pure ASGI middleware so that
    streaming and disconnect detection are untouched."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        request_id = headers.get(b"x-request-id", b"").decode("latin-1") or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_id)


def _auth_dependency(api_key: str | None) -> Callable:
    expected = f"Bearer {api_key}".encode() if api_key else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise Unauthorized("invalid or missing API key")

    return check


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EngineError)
    async def engine_error(request: Request, exc: EngineError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(EngineError(f"internal error: {type(exc).__name__}"))

    @app.exception_handler(HTTPException)
    async def framework_error(request: Request, exc: HTTPException) -> JSONResponse:
        """An unknown route or method, in the same shape as every other error."""
        error_type = "NotFoundError" if exc.status_code == 404 else "BadRequestError"
        body = protocol.error_body(str(exc.detail), None, exc.status_code, error_type)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = protocol.param_from_loc(first.get("loc", ()))
        return JSONResponse(protocol.error_body(f"{param}: {first.get('msg')}", param), status_code=400)


def error_response(exc: EngineError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status_code in (429, 503) else None
    return JSONResponse(exc.to_body(), status_code=exc.status_code, headers=headers)


# --- admin routes -------------------------------------------------------------------------------------


def _admin_router(serving: Serving, auth: Callable) -> APIRouter:
    """Health, metrics and tokenizer routes are open (as in vLLM); the ones that change state need the key."""
    router = APIRouter()
    engine, config = serving.engine, serving.config

    @router.get("/health", responses={
        **openapi_error_responses(), 503: {"description": "not ready, or draining (with Retry-After); no body"}})
    async def health() -> Response:
        if serving.lifecycle.draining:
            return Response(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        return Response(status_code=200 if getattr(engine, "ready", True) else 503)

    @router.get("/metrics", responses=openapi_error_responses())
    async def metrics() -> Response:
        serving.metrics.record_scheduler(engine.stats())
        return Response(serving.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @router.get("/v1/fleet/config", responses=openapi_error_responses())
    async def fleet_config() -> dict:
        """The effective settings (engine.reference.config_report): open, like /metrics; nothing secret."""
        return effective_config(config, engine.num_blocks)

    @router.post("/tokenize", responses=openapi_error_responses(400))
    async def tokenize(body: protocol.TokenizeRequest) -> dict:
        body.check(serving.model_name)
        if body.messages is not None:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            tokens = serving.chat_prompt(messages, body.add_generation_prompt)
        else:
            tokens = serving.text_prompt(body.prompt, body.add_special_tokens)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": config.max_model_len}

    @router.post("/detokenize", responses=openapi_error_responses(400))
    async def detokenize(body: protocol.DetokenizeRequest) -> dict:
        vocab = len(engine.tokenizer)
        if any(not 0 <= t < vocab for t in body.tokens):
            raise InvalidRequest(f"token ids must be in [0, {vocab})", param="tokens")
        return {"prompt": engine.tokenizer.decode(body.tokens)}

    @router.post("/reset_prefix_cache", dependencies=[Depends(auth)], responses=openapi_error_responses(401))
    async def reset_prefix_cache() -> dict:
        return {"reset": bool(await engine.reset_prefix_cache())}

    @router.post("/drain", status_code=202, dependencies=[Depends(auth)], responses=openapi_error_responses(401))
    async def drain() -> dict:
        serving.begin_drain()
        return {"status": "draining", "in_flight": serving.lifecycle.in_flight, "grace_s": config.drain_grace_s}

    return router


# --- OpenAI routes ------------------------------------------------------------------------------------


# A generation can be refused (400, 401, 503 while draining) or fail its P/D K/V transfer (502). Errors found
# after an SSE stream started are reported in-band, as a `data: {"error": ...}` event before [DONE].
_GENERATION_ERRORS = openapi_error_responses(400, 401, 502, 503)


def _openai_router(serving: Serving) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models", responses=openapi_error_responses(401, 503))
    async def models() -> dict:
        card = {
            "id": serving.model_name, "object": "model", "created": int(time.time()), "owned_by": "fleetctl",
            "root": serving.config.model, "parent": None, "max_model_len": serving.config.max_model_len,
            "permission": [],
        }
        return {"object": "list", "data": [card]}

    @router.post("/v1/completions", responses=_GENERATION_ERRORS)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        body.check(serving.model_name)
        prompt_ids = serving.text_prompt(body.single_prompt)
        return await Generation(serving, request, body, prompt_ids, chat=False).respond()

    @router.post("/v1/chat/completions", responses=_GENERATION_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        body.check(serving.model_name)
        prompt_ids = serving.chat_prompt(body.chat_messages(), body.add_generation_prompt)
        return await Generation(serving, request, body, prompt_ids, chat=True).respond()

    return router
