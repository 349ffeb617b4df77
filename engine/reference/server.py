"""The reference engine's HTTP API: OpenAI-compatible endpoints, vLLM's extras, /metrics, P/D K/V transfer.

`build_app(engine, config)` wires a started AsyncEngine into a FastAPI app:
- /v1/completions, /v1/chat/completions: JSON or SSE (`data: {chunk}` ... `data: [DONE]`, a `: keep-alive`
  comment every keepalive_interval_s while a stream waits for its next token, a usage chunk with
  stream_options.include_usage). P/D: `kv_transfer_params.do_remote_decode` holds (and optionally pushes)
  the prompt's blocks and returns kv_transfer_params; `do_remote_prefill` loads them (engine.reference.kv_transfer).
- /v1/models, /health, /tokenize, /detokenize, /reset_prefix_cache, /metrics, /drain, /kv/{pull,push,release}.
- Every error is an OpenAI-style body {"error": {"message", "type", "param", "code"}}: engine.errors render
  themselves; pydantic validation errors become 400 naming the field (not FastAPI's 422), as in vLLM.
- A client that goes away aborts its request (the engine frees its blocks).
- Draining (POST /drain, or SIGTERM via __main__): /health and new /v1 requests answer 503 with Retry-After,
  in-flight requests get drain_grace_s to finish, then `on_exit` is called to stop the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from engine import protocol
from engine.errors import EngineDraining, EngineError, InvalidRequest, Unauthorized
from engine.protocol import ChatCompletionRequest, CompletionRequest, LogprobFormatter, ResponseHeader
from engine.reference.config import EngineConfig
from engine.reference.kv_event_publisher import KVEventPublisher
from engine.reference.kv_transfer import KVTransfer
from engine.reference.metrics import CacheInfo, EngineMetrics
from engine.reference.outputs import RequestOutput
from engine.reference.sampling_params import SamplingParams

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
_DISCONNECT_POLL_S = 0.5  # how often a non-streaming request checks whether its client is still there


# --- lifecycle: ready, draining, exit -----------------------------------------------------------------


class Lifecycle:
    """Counts in-flight generation requests and runs the drain: refuse new ones, let old ones finish, exit."""

    def __init__(self, grace_s: float, on_exit: Callable[[], None] | None):
        self.grace_s = grace_s
        self.on_exit = on_exit
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._drain_task: asyncio.Task | None = None

    def admit(self) -> None:
        if self.draining:
            raise EngineDraining("the engine is draining; retry on another engine")
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def start_drain(self, wait_also: Callable[[], bool] = lambda: False) -> None:
        """Idempotent. `wait_also` is polled too (e.g. K/V still held for a pull)."""
        if self._drain_task is None:
            self.draining = True
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(wait_also))

    async def _drain(self, wait_also: Callable[[], bool]) -> None:
        log.info("draining: %d request(s) in flight, grace %.1fs", self.in_flight, self.grace_s)
        deadline = time.monotonic() + self.grace_s
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.grace_s)
        while wait_also() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.in_flight:
            log.warning("drain grace over with %d request(s) still in flight", self.in_flight)
        if self.on_exit is not None:
            self.on_exit()


# --- one request's outputs ----------------------------------------------------------------------------

_PENDING = object()  # next() timed out: nothing new yet
_END = object()  # the engine's stream ended


class OutputStream:
    """An engine request's outputs, awaited with a timeout without cancelling the request on timeout.

    close() aborts the request if it is not finished (the engine frees its blocks)."""

    def __init__(self, outputs: AsyncIterator[RequestOutput]):
        self._outputs = outputs
        self._next: asyncio.Future | None = None

    async def next(self, timeout_s: float | None) -> Any:
        """The next RequestOutput, _PENDING after timeout_s, _END at the end; engine errors raise."""
        if self._next is None:
            self._next = asyncio.ensure_future(self._outputs.__anext__())
        done, _ = await asyncio.wait({self._next}, timeout=timeout_s)
        if not done:
            return _PENDING
        future, self._next = self._next, None
        try:
            return future.result()
        except StopAsyncIteration:
            return _END

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            if self._next is not None and not self._next.done():
                self._next.cancel()
                with contextlib.suppress(BaseException):
                    await self._next
            await self._outputs.aclose()


class Accumulated:
    """A request's outputs folded into what a non-streaming response needs."""

    def __init__(self) -> None:
        self.text = ""
        self.logprobs: list = []
        self.last: RequestOutput | None = None

    def add(self, output: RequestOutput) -> None:
        self.text += output.new_text
        self.logprobs += output.new_logprobs or []
        self.last = output


# --- the app ------------------------------------------------------------------------------------------


class Serving:
    """Everything the routes share: the engine, its settings, metrics, P/D transfer, the lifecycle."""

    def __init__(self, engine: Any, config: EngineConfig, on_exit: Callable[[], None] | None):
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
        self.lifecycle = Lifecycle(config.drain_grace_s, on_exit)
        engine.add_step_listener(self.metrics.on_step)
        if self.publisher is not None:
            engine.add_step_listener(self.publisher.on_step)

    async def refuse_while_draining(self) -> None:
        if self.lifecycle.draining:
            raise EngineDraining("the engine is draining; retry on another engine")

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


def _largest_frame(engine: Any, config: EngineConfig) -> int:
    """A P/D engine keeps a frame buffer this large ready, so its first transfer pays no page faults."""
    return config.max_model_len * engine.bytes_per_block // engine.block_size


def _make_publisher(config: EngineConfig) -> KVEventPublisher | None:
    if not config.kv_events_endpoint:
        return None
    return KVEventPublisher(config.kv_events_endpoint, config.kv_events_replay_endpoint, config.kv_events_topic)


def build_app(engine: Any, config: EngineConfig, on_exit: Callable[[], None] | None = None) -> FastAPI:
    """The HTTP app for a started engine. `on_exit` is called when a drain completes (the process should stop)."""
    serving = Serving(engine, config, on_exit)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if serving.publisher is not None:
            serving.publisher.start()
        await serving.kv.start()
        try:
            yield
        finally:
            await serving.kv.aclose()
            if serving.publisher is not None:
                serving.publisher.shutdown()

    app = FastAPI(title="fleetctl reference engine", lifespan=lifespan)
    app.state.serving = serving
    app.add_middleware(RequestIdMiddleware)
    _add_error_handlers(app)
    auth = _auth_dependency(config.api_key)
    app.include_router(_openai_router(serving), dependencies=[Depends(auth), Depends(serving.refuse_while_draining)])
    app.include_router(serving.kv.router(auth))
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

    @router.get("/health")
    async def health() -> Response:
        if serving.lifecycle.draining:
            return Response(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        return Response(status_code=200 if getattr(engine, "ready", True) else 503)

    @router.get("/metrics")
    async def metrics() -> Response:
        serving.metrics.record_scheduler(engine.stats())
        return Response(serving.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @router.post("/tokenize")
    async def tokenize(body: protocol.TokenizeRequest) -> dict:
        body.check(serving.model_name)
        if body.messages is not None:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            tokens = serving.chat_prompt(messages, body.add_generation_prompt)
        else:
            tokens = serving.text_prompt(body.prompt, body.add_special_tokens)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": config.max_model_len}

    @router.post("/detokenize")
    async def detokenize(body: protocol.DetokenizeRequest) -> dict:
        vocab = len(engine.tokenizer)
        if any(not 0 <= t < vocab for t in body.tokens):
            raise InvalidRequest(f"token ids must be in [0, {vocab})", param="tokens")
        return {"prompt": engine.tokenizer.decode(body.tokens)}

    @router.post("/reset_prefix_cache", dependencies=[Depends(auth)])
    async def reset_prefix_cache() -> dict:
        return {"reset": bool(await engine.reset_prefix_cache())}

    @router.post("/drain", status_code=202, dependencies=[Depends(auth)])
    async def drain() -> dict:
        serving.begin_drain()
        return {"status": "draining", "in_flight": serving.lifecycle.in_flight, "grace_s": config.drain_grace_s}

    return router


# --- OpenAI routes ------------------------------------------------------------------------------------


def _openai_router(serving: Serving) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict:
        card = {
            "id": serving.model_name, "object": "model", "created": int(time.time()), "owned_by": "fleetctl",
            "root": serving.config.model, "parent": None, "max_model_len": serving.config.max_model_len,
            "permission": [],
        }
        return {"object": "list", "data": [card]}

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        body.check(serving.model_name)
        prompt_ids = serving.text_prompt(body.single_prompt)
        return await Generation(serving, request, body, prompt_ids, chat=False).respond()

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        body.check(serving.model_name)
        prompt_ids = serving.chat_prompt(body.chat_messages(), body.add_generation_prompt)
        return await Generation(serving, request, body, prompt_ids, chat=True).respond()

    return router


class Generation:
    """One /v1 completion request, from validated body to JSON or SSE response."""

    def __init__(self, serving: Serving, request: Request, body: Any, prompt_ids: list[int], chat: bool):
        self.serving = serving
        self.request = request
        self.body = body
        self.prompt_ids = prompt_ids
        self.chat = chat
        client_id = request.state.request_id
        self.request_id = f"{client_id}-{uuid.uuid4().hex[:8]}"  # unique even if a client reuses its id
        prefix = "chatcmpl" if chat else "cmpl"
        self.header = ResponseHeader(f"{prefix}-{self.request_id}", serving.model_name)
        self.logprobs = LogprobFormatter(serving.token_text, body.return_tokens_as_token_ids)
        self.pusher = None
        self.kv_transfer_params: dict | None = None
        self._outputs_stream: OutputStream | None = None
        self._first: Any = _PENDING
        self._closed = False

    async def respond(self) -> Response:
        self.serving.lifecycle.admit()
        try:
            outputs = await self._start()
        except BaseException:
            await self._finish()
            raise
        if self.body.stream:
            return _SSEResponse(self._sse(outputs), on_close=self._finish)
        try:
            return await self._complete(outputs)
        finally:
            await self._finish()

    async def _start(self) -> OutputStream:
        """Validate against the context window, do the P/D side work, and submit to the engine. Errors the
        engine finds quickly (before its first output or within one keep-alive interval) raise here as HTTP errors."""
        body, config = self.body, self.serving.config
        params = body.to_sampling_params(body.resolve_max_tokens(len(self.prompt_ids), config.max_model_len))
        outputs = self._outputs_stream = OutputStream(await self._submit(params))
        self._first = await outputs.next(min(config.keepalive_interval_s, 1.0))
        return outputs

    async def _submit(self, params: SamplingParams) -> AsyncIterator[RequestOutput]:
        body, kv, engine = self.body, self.serving.kv, self.serving.engine
        engine.validate(self.prompt_ids, params)  # bad requests fail here as HTTP 400, before any P/D work
        extra: dict[str, Any] = {}
        if body.remote_prefill:
            external = await kv.acquire(body.kv_transfer_params, self.prompt_ids)
            if external is not None:
                extra = {"external_kv": external.kv, "external_kv_tokens": external.num_tokens}
        if body.remote_decode:
            self.pusher = kv.push_sender(self.request_id, body.kv_transfer_params)
            extra = {"hold_blocks": True, "kv_push": self.pusher}
        return engine.generate(self.request_id, self.prompt_ids, params, **extra)

    async def _finish(self) -> None:
        """Abort the request if it is still running, stop pushing, and leave the in-flight count. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._outputs_stream is not None:
            await self._outputs_stream.close()
        if self.pusher is not None:
            self.pusher.cancel()
        self.serving.lifecycle.leave()

    async def _outputs(self, outputs: OutputStream, timeout_s: float) -> AsyncIterator[RequestOutput | None]:
        """The request's outputs; None whenever timeout_s passes without one."""
        first, self._first = self._first, _PENDING
        while True:
            output = first if first is not _PENDING else await outputs.next(timeout_s)
            first = _PENDING
            if output is _END:
                return
            if output is _PENDING:
                yield None
                continue
            await self._on_output(output)
            yield output
            if output.finished:
                return

    async def _on_output(self, output: RequestOutput) -> None:
        if not output.finished:
            return
        if self.pusher is not None:
            await self.pusher.finish(self.serving.config.kv_transfer_timeout_s)
        if output.kv_transfer_params:
            self.kv_transfer_params = self.serving.kv.finished_prefill(
                output.kv_transfer_params, self.prompt_ids, prepare=self.pusher is None)

    # non-streaming

    async def _complete(self, outputs: OutputStream) -> Response:
        acc = Accumulated()
        next_check = time.monotonic() + _DISCONNECT_POLL_S
        async for output in self._outputs(outputs, _DISCONNECT_POLL_S):
            if output is not None:
                acc.add(output)
            if time.monotonic() >= next_check:  # whether tokens flow or not
                next_check = time.monotonic() + _DISCONNECT_POLL_S
                if await self.request.is_disconnected():
                    log.info("client of %s went away; aborting", self.request_id)
                    return Response(status_code=499)
        if acc.last is None:
            raise EngineError("the engine ended the request without output")
        return JSONResponse(self._response_body(acc))

    def _response_body(self, acc: Accumulated) -> dict:
        last = acc.last
        logprobs = None
        if self.body.num_logprobs is not None:
            logprobs = self.logprobs.chat(acc.logprobs) if self.chat else self.logprobs.completion(acc.logprobs)
        make_choice = protocol.chat_choice if self.chat else protocol.completion_choice
        body = self.header.fields("chat.completion" if self.chat else "text_completion")
        body["choices"] = [make_choice(acc.text, logprobs, last.finish_reason, last.stop_reason)]
        body["usage"] = protocol.usage(last.num_prompt_tokens, last.num_output_tokens, last.num_cached_tokens)
        body["kv_transfer_params"] = self.kv_transfer_params
        return body

    # streaming

    async def _sse(self, outputs: OutputStream) -> AsyncIterator[str]:
        interval = self.serving.config.keepalive_interval_s
        last: RequestOutput | None = None
        try:
            if self.chat:
                role = protocol.chat_delta_choice({"role": "assistant", "content": ""}, None, None, None)
                yield _data(self._chunk(role))
            async for output in self._outputs(outputs, interval):
                if output is None:
                    yield ": keep-alive\n\n"
                    continue
                last = output
                chunk = self._delta_chunk(output)
                if chunk is not None:
                    yield _data(chunk)
            if last is not None and self.body.include_usage:
                yield _data(self._usage_chunk(last))
        except EngineError as exc:  # found after the stream started: reported in-band, as vLLM does
            yield _data(exc.to_body())
        finally:
            await self._finish()
        yield "data: [DONE]\n\n"

    def _chunk(self, choice: dict) -> dict:
        chunk = self.header.fields("chat.completion.chunk" if self.chat else "text_completion")
        chunk["choices"] = [choice]
        if self.body.include_usage:
            chunk["usage"] = None
        return chunk

    def _delta_chunk(self, output: RequestOutput) -> dict | None:
        if not output.new_text and not output.new_logprobs and not output.finished:
            return None
        logprobs = None
        if self.body.num_logprobs is not None:
            new = output.new_logprobs or []
            logprobs = self.logprobs.chat(new) if self.chat else self.logprobs.completion(new)
        if self.chat:
            delta = {"content": output.new_text} if output.new_text or not output.finished else {}
            choice = protocol.chat_delta_choice(delta, logprobs, output.finish_reason, output.stop_reason)
        else:
            choice = protocol.completion_choice(output.new_text, logprobs, output.finish_reason, output.stop_reason)
        chunk = self._chunk(choice)
        if output.finished and self.kv_transfer_params is not None:
            chunk["kv_transfer_params"] = self.kv_transfer_params
        return chunk

    def _usage_chunk(self, last: RequestOutput) -> dict:
        chunk = self.header.fields("chat.completion.chunk" if self.chat else "text_completion")
        chunk["choices"] = []
        chunk["usage"] = protocol.usage(last.num_prompt_tokens, last.num_output_tokens, last.num_cached_tokens)
        return chunk


class _SSEResponse(StreamingResponse):
    """A StreamingResponse that always runs `on_close`, even if the client left before the stream started
    (then Starlette never iterates the generator, and its `finally` would never run)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Any]):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
