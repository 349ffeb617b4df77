"""One client request through the gateway: parse, route (service.prepare), admit, send (dispatch / pd), answer.

Answers:
- non-streamed: the engine's JSON; a client that goes away cancels the engine call (the engine aborts);
- streamed: if the first token arrives within `keepalive_interval_s`, the response starts with the routing
  headers; otherwise it starts at once with `x-fleet-served-by: <class_ref> -`, sends `: keep-alive`
  comments while engines are tried, then a `: x-fleet-served-by <class_ref> <engine>` comment. A failure
  before the stream started is an HTTP error (status and OpenAI error body); after it started, an error
  event, a final chunk with finish_reason "error", and [DONE].
Every response carries `x-request-id` and, once an engine is chosen, `x-fleet-served-by: <class_ref>
<engine>` (P/D: the decode engine; `x-fleet-prefilled-by` names the prefill engine). One log line per request
says the same, with the status, the duration and the API key's name (never the key).
A canary probe (`x-fleet-probe`, probe_traffic.py) is served the same way; `finish` counts it in the probe
counters instead of the request, latency and per-class-revision metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from engine.contract.faults import PIN_ENGINE_HEADER
from fleetctl.gateway.class_choice import PIN_HEADER
from fleetctl.gateway.dispatch import Dispatcher, RequestContext, Sent, StreamStart
from fleetctl.gateway.errors import GatewayError, NoRoute, TooManyRequests, UpstreamFailed
from fleetctl.gateway.explain import explain_body
from fleetctl.gateway.pd import PDHandoff
from fleetctl.gateway.probe_traffic import record_probe
from fleetctl.gateway.relay import DONE, KEEPALIVE, ChunkHeader, StreamWatch, error_ending, relay, sse_data
from fleetctl.gateway.requests import CHAT, ClientRequest, decode_json, parse_request
from fleetctl.gateway.router import PD
from fleetctl.gateway.served import Outcome
from fleetctl.gateway.service import GatewayService, Prepared
from fleetctl.gateway.upstream import EngineRejected

log = logging.getLogger("fleetctl.gateway.requests")

SESSION_HEADER = "x-session-id"
CLIENT_CLOSED = 499  # nginx's "client closed request": the client went away before the answer
SERVED_BY_HEADER = "x-fleet-served-by"
PREFILLED_BY_HEADER = "x-fleet-prefilled-by"
_DISCONNECT_POLL_S = 0.5
HARD_STREAM_ERRORS = ("disconnect", "idle_timeout")
SHED_RETRY_AFTER_S = 2  # a shed request's Retry-After


def error_response(exc: GatewayError) -> JSONResponse:
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is None and exc.status_code in (429, 503):
        retry_after = 1
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(exc.to_body(), status_code=exc.status_code, headers=headers)


def rejected_response(exc: EngineRejected) -> Response:
    return Response(exc.body, status_code=exc.status, media_type=exc.content_type or "application/json")


class FrontDoor:
    def __init__(self, service: GatewayService):
        self.service = service
        self.metrics = service.metrics
        self.dispatcher = Dispatcher(service)
        self.pd = PDHandoff(self.dispatcher)

    # --- the request ---

    async def generate(self, kind: str, http: Request, ctx: RequestContext) -> Response:
        status = 500
        try:
            response = await self._generate(kind, http, ctx)
            status = response.status_code
            if isinstance(response, SSEResponse):
                response.on_finish = lambda: self.finish(ctx, status)
                return response
        except GatewayError as exc:
            response, status = error_response(exc), exc.status_code
        except EngineRejected as exc:
            response, status = rejected_response(exc), exc.status
        except ClientDisconnect:  # gone before its body arrived (a cancelled probe filler): nobody to answer
            response, status = Response(status_code=CLIENT_CLOSED), CLIENT_CLOSED
        except Exception:
            log.exception("request %s failed", ctx.request_id)
            response, status = error_response(GatewayError("internal gateway error")), 500
        self.finish(ctx, status)
        return with_routing_headers(response, ctx)

    async def _generate(self, kind: str, http: Request, ctx: RequestContext) -> Response:
        request = parse_request(kind, await http.body())
        ctx.model = self.service.model_label(request)
        if ctx.probe is None and ctx.model != "unknown" and self.service.shed(ctx.model):
            # the shed_fraction flag: refused before any work (probes pass, so the canary keeps measuring)
            self.metrics.shed.labels(ctx.model).inc()
            raise TooManyRequests(f"shed: the model {ctx.model} sheds part of its load (flag shed_fraction)",
                                  retry_after_s=SHED_RETRY_AFTER_S)
        ctx.session_id = http.headers.get(SESSION_HEADER) or None
        pin = http.headers.get(PIN_HEADER) or None
        pin_engine = (http.headers.get(PIN_ENGINE_HEADER) or None) if ctx.probe is not None else None
        prepared = await self.service.prepare(request, pin, ctx.session_id, pin_engine)
        ctx.model, ctx.class_ref = prepared.model, prepared.class_ref
        self._count_fallback(prepared)
        self._require_engines(prepared)
        self._admit(prepared)
        if ctx.probe is None:  # probes are not user traffic (probe_traffic.py)
            self.metrics.added_latency.labels(prepared.model).observe(time.monotonic() - ctx.arrived)
            self.service.admitted(prepared)
        ctx.probe_tokens.prompt = len(prepared.prompt_ids)  # until the engine's usage says otherwise
        if request.stream:
            return await self._stream(ctx, prepared, request)
        return await self._complete(ctx, prepared, request, http)

    def _count_fallback(self, prepared: Prepared) -> None:
        if prepared.plan.fallback is not None:
            self.metrics.pd_fallbacks.labels(prepared.model, prepared.plan.fallback).inc()

    def _require_engines(self, prepared: Prepared) -> None:
        """503 (not an admission 429) when the class has no healthy engine at all."""
        if not prepared.plan.candidates:
            why = self.service.describe_unhealthy(prepared)
            raise NoRoute(f"no healthy engine for class {prepared.class_ref} of model {prepared.model}: {why}")

    def _admit(self, prepared: Prepared) -> None:
        decision = prepared.plan.admission
        if decision is None:
            return
        self.metrics.admission.labels(prepared.model, "admit" if decision.admit else "reject").inc()
        if decision.admit:
            return
        for reason in rejection_reasons(decision.reason):
            self.metrics.admission_rejections.labels(prepared.model, reason).inc()
        raise TooManyRequests(f"admission control: {decision.reason}", retry_after_s=decision.retry_after_s or 1)

    async def _send(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest, stream: bool) -> Any:
        """Start the request on engines: P/D or whole. A P/D handoff no prefill (or decode) engine could
        start falls back once to whole-request engines, if the replanned route has any."""
        try:
            return await self._send_once(ctx, prepared, request, stream)
        except UpstreamFailed:
            if prepared.plan.mode != PD:
                raise
            replanned = await self.service.prepare(request, prepared.class_ref, ctx.session_id)
            if replanned.plan.mode == PD or not replanned.plan.candidates:
                raise
            self.metrics.pd_fallbacks.labels(prepared.model, "handoff failed").inc()
            return await self._send_once(ctx, replanned, request, stream)

    async def _send_once(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest, stream: bool) -> Any:
        if prepared.plan.mode == PD:
            return await (self.pd.open_stream if stream else self.pd.complete)(ctx, prepared, request)
        return await (self.dispatcher.open_whole_stream if stream else self.dispatcher.complete_whole)(ctx, prepared, request)

    # --- non-streamed ---

    async def _complete(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest, http: Request) -> Response:
        task = asyncio.ensure_future(self._send(ctx, prepared, request, stream=False))
        while not task.done():
            await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if not task.done() and await http.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                log.info("request %s: client went away; engine call cancelled", ctx.request_id)
                return Response(status_code=CLIENT_CLOSED)
        sent: Sent[dict[str, Any]] = task.result()
        sent.live.finish(sent.ticket)
        usage = sent.result.get("usage") or {}
        sent.ticket.generated = int(usage.get("completion_tokens") or 0)
        ctx.probe_tokens.from_usage(usage)
        return JSONResponse(sent.result)

    # --- streamed ---

    async def _stream(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest) -> Response:
        opener = asyncio.ensure_future(self._send(ctx, prepared, request, stream=True))
        await asyncio.wait({opener}, timeout=self.service.settings.keepalive_interval_s)
        session = StreamSession(self, ctx, prepared, request, opener)
        if opener.done():
            session.start = opener.result()  # a failure raises: an HTTP error, the stream never started
        else:
            ctx.served_by = f"{prepared.class_ref} -"
        return SSEResponse(session.events(), on_close=session.close, headers=routing_headers(ctx))

    # --- bookkeeping ---

    def finish(self, ctx: RequestContext, status: int) -> None:
        elapsed = time.monotonic() - ctx.arrived
        if ctx.probe is not None:  # a canary probe: its own counters, never the user-facing ones
            record_probe(self.metrics, ctx.model, ctx.class_ref, ctx.probe, ctx.probe_tokens)
        else:
            self.metrics.requests.labels(ctx.model, str(status)).inc()
            self.metrics.request_seconds.labels(ctx.model).observe(elapsed)
            if ctx.class_ref is not None:
                self.service.served.record(outcome_of(ctx, status))
        log.info("request %s model=%s served_by=%r prefilled_by=%s status=%d %.3fs key=%s%s", ctx.request_id,
                 ctx.model, ctx.served_by, ctx.prefilled_by or "-", status, elapsed, ctx.key_name or "-",
                 f" probe={ctx.probe}" if ctx.probe else "")

    # --- explain ---

    async def explain(self, http: Request) -> dict[str, Any]:
        raw = await http.body()
        kind = CHAT if "messages" in decode_json(raw) else "completion"
        request = parse_request(kind, raw)
        prepared = await self.service.prepare(request, http.headers.get(PIN_HEADER) or None,
                                              http.headers.get(SESSION_HEADER) or None)
        return explain_body(prepared, self.service)


class StreamSession:
    """One streamed answer: waits for the first token (with keep-alives), relays, and cleans up on close."""

    def __init__(self, door: FrontDoor, ctx: RequestContext, prepared: Prepared, request: ClientRequest,
                 opener: asyncio.Future):
        self.door = door
        self.ctx = ctx
        self.prepared = prepared
        self.opener = opener
        self.start: StreamStart | None = None
        chat = request.kind == CHAT
        prefix = "chatcmpl" if chat else "cmpl"
        self.header = ChunkHeader(chat, f"{prefix}-{ctx.request_id}", prepared.model)

    async def events(self) -> AsyncIterator[str]:
        if self.start is None:
            async for line in self._wait_for_start():
                yield line
            if self.start is None:
                return
            yield f": {SERVED_BY_HEADER} {self.ctx.served_by}\n\n"
        settings = self.door.service.settings
        async for line in relay(self.start.reader, self.start.held, self.header, settings.keepalive_interval_s,
                                settings.idle_timeout_s, self._watch()):
            yield line

    async def _wait_for_start(self) -> AsyncIterator[str]:
        interval = self.door.service.settings.keepalive_interval_s
        while not self.opener.done():
            await asyncio.wait({self.opener}, timeout=interval)
            if not self.opener.done():
                yield KEEPALIVE
        try:
            self.start = self.opener.result()
        except GatewayError as exc:
            self.ctx.inband_status = exc.status_code
            for line in error_ending(self.header, exc.message, exc.status_code):
                yield line
        except EngineRejected as exc:
            self.ctx.inband_status = exc.status
            yield f"data: {exc.body.decode(errors='replace')}\n\n"
            yield sse_data(self.header.error_chunk())
            yield DONE

    def _watch(self) -> StreamWatch:
        ctx, metrics, sent = self.ctx, self.door.metrics, self.start.sent  # type: ignore[union-attr]

        def first_token() -> None:
            if ctx.first_token_at is None:
                ctx.first_token_at = time.monotonic()
                if ctx.probe is None:
                    metrics.ttft.labels(ctx.model).observe(ctx.first_token_at - ctx.arrived)

        def tokens(n: int) -> None:
            sent.ticket.generated += n
            ctx.tokens.note(n, time.monotonic())
            ctx.probe_tokens.completion += n

        def error(reason: str) -> None:
            ctx.stream_cut = True
            metrics.stream_errors.labels(reason).inc()
            sent.live.record_failure(reason, hard=reason in HARD_STREAM_ERRORS)
            log.warning("request %s: stream from %s ended with an error (%s)", ctx.request_id, sent.route.name, reason)

        return StreamWatch(first_token, tokens, error, ctx.probe_tokens.from_usage)

    async def close(self) -> None:
        if not self.opener.done():
            self.opener.cancel()
            await asyncio.gather(self.opener, return_exceptions=True)
        if self.start is None and not self.opener.cancelled() and self.opener.exception() is None:
            self.start = self.opener.result()  # started, but the client left before the stream did
        if self.start is not None:
            self.start.sent.live.finish(self.start.sent.ticket)
            await self.start.reader.close()


def outcome_of(ctx: RequestContext, status: int) -> Outcome:
    """A finished request for the per-revision counters (served.py); ctx.class_ref must be set."""
    ttft = ctx.first_token_at - ctx.arrived if ctx.first_token_at is not None else None
    return Outcome(ctx.model, ctx.class_ref or "", ctx.inband_status or status, ctx.stream_cut, ttft,
                   ctx.tokens.mean_itl())


def routing_headers(ctx: RequestContext) -> dict[str, str]:
    headers = {}
    if ctx.served_by:
        headers[SERVED_BY_HEADER] = ctx.served_by
    if ctx.prefilled_by:
        headers[PREFILLED_BY_HEADER] = ctx.prefilled_by
    return headers


def with_routing_headers(response: Response, ctx: RequestContext) -> Response:
    for name, value in routing_headers(ctx).items():
        response.headers[name] = value
    return response


def rejection_reasons(reason: str) -> list[str]:
    """Metric labels for an admission rejection's violations (admission.predict's wording)."""
    labels = []
    if "TTFT" in reason:
        labels.append("ttft")
    if "decode slots" in reason:
        labels.append("decode_slots")
    if "KV" in reason:
        labels.append("kv")
    return labels or ["no_engine"]


class SSEResponse:
    """The client's event stream, as a plain ASGI response.

    Starlette's StreamingResponse runs every stream in an anyio task group, with a second task listening for
    the client's disconnect (~0.05 ms of CPU per request here, and the gateway's added latency is its CPU).
    This does the same with one asyncio task: the listener cancels the stream when the client goes (uvicorn
    drops writes to a closed connection silently, so without it a stream would run on to its end), and the
    stream then ends quietly. `on_close` always runs, then `on_finish`, even when the client left before the
    stream started."""

    status_code = 200

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Any], headers: dict[str, str]):
        self.content = content
        self._on_close = on_close
        self.on_finish: Callable[[], None] | None = None
        self.headers = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", **headers}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        stream = _Stream(asyncio.current_task())
        listener = asyncio.ensure_future(_cancel_when_client_leaves(receive, stream))
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]})
            async for chunk in self.content:
                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not stream.client_gone:
                raise  # the server is shutting down: not ours to swallow
            stream.task.uncancel()
        except OSError:
            pass  # the client's connection broke under a write
        finally:
            stream.done = True
            listener.cancel()
            await _close_quietly(self.content)
            await self._on_close()
            if self.on_finish is not None:
                self.on_finish()


@dataclass
class _Stream:
    task: asyncio.Task
    done: bool = False
    client_gone: bool = False


async def _cancel_when_client_leaves(receive: Callable, stream: _Stream) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if not stream.done:
        stream.client_gone = True
        stream.task.cancel()


async def _close_quietly(content: AsyncIterator[str]) -> None:
    """End an async generator the stream left unfinished (its `finally` blocks run now, not at GC)."""
    aclose = getattr(content, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:  # its own cleanup failing must not hide the stream's
            log.exception("closing a stream's generator failed")
