"""One /v1 completion request, from a validated body to a JSON or SSE response.

`Generation.respond()` admits the request (engine.reference.server_lifecycle), resolves max_tokens against the
context window, does the P/D side work (acquire the prompt's K/V on decode, push or hold it on prefill) and
submits to the engine. Errors the engine finds quickly (before its first output, or within one keep-alive
interval) are HTTP errors; later ones are reported in-band in the stream, as vLLM does.
- JSON: outputs folded into one body (`Accumulated`); the client is polled every `_DISCONNECT_POLL_S` and a
  client that went away aborts the request (499).
- SSE: `data: {chunk}` ... `data: [DONE]`, a `: keep-alive` comment every keepalive_interval_s while the stream
  waits for its next token, a usage chunk with stream_options.include_usage.
- Both carry the fleet extension `{"fleet": {"batch_size_min", "batch_size_max"}}` (engine.contract.faults): in
  the JSON body, and in a stream's usage chunk.
Invariant: however the request ends (finished, error, client gone before or during the stream), it is aborted
in the engine if unfinished, its pusher is stopped and it leaves the in-flight count, exactly once (`_finish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from engine import protocol
from engine.errors import EngineError
from engine.protocol import ChatCompletionRequest, CompletionRequest, LogprobFormatter, ResponseHeader
from engine.reference.kv_push import PushSender
from engine.reference.kv_tier_peer import peer_source
from engine.contract.faults import RESPONSE_EXTENSION
from engine.contract.outputs import RequestOutput
from engine.contract.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.reference.server import Serving

log = logging.getLogger(__name__)

_DISCONNECT_POLL_S = 0.5  # how often a non-streaming request checks whether its client is still there
_FIRST_OUTPUT_POLL_S = 0.1  # ... and any request, while it waits for its first output before answering


class _ClientGone(Exception):
    """The client left before the response started."""


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


# --- the request ---------------------------------------------------------------------------------------


class Generation:
    """One /v1 completion request, from validated body to JSON or SSE response."""

    def __init__(self, serving: Serving, request: Request, body: CompletionRequest | ChatCompletionRequest,
                 prompt_ids: list[int], chat: bool):
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
        self.pusher: PushSender | None = None
        self.kv_transfer_params: dict | None = None
        self._outputs_stream: OutputStream | None = None
        self._first: Any = _PENDING
        self._closed = False

    async def respond(self) -> Response:
        self.serving.lifecycle.admit()
        try:
            outputs = await self._start()
        except _ClientGone:
            await self._finish()
            log.info("client of %s went away before its first output; aborted", self.request_id)
            return Response(status_code=499)
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
        deadline = time.monotonic() + min(config.keepalive_interval_s, 1.0)
        while (left := deadline - time.monotonic()) > 0:
            self._first = await outputs.next(min(left, _FIRST_OUTPUT_POLL_S))
            if self._first is not _PENDING:
                break
            if await self.request.is_disconnected():  # no response has started: nothing else would notice
                raise _ClientGone
        return outputs

    async def _submit(self, params: SamplingParams) -> AsyncIterator[RequestOutput]:
        body, kv, engine = self.body, self.serving.kv, self.serving.engine
        engine.validate(self.prompt_ids, params)  # bad requests fail here as HTTP 400, before any P/D work
        extra: dict[str, Any] = {}
        if body.remote_prefill:
            external = await kv.acquire(body.kv_transfer_params, self.prompt_ids)
        elif self.serving.tier is not None:
            external = await self.serving.tier.acquire(self.prompt_ids, peer_source(body.kv_transfer_params))
        else:
            external = None
        if external is not None:
            extra = {"external_kv": external.kv, "external_kv_tokens": external.num_tokens,
                     "external_kv_first_block": external.first_block}
        if body.remote_decode:
            self.pusher = kv.push_sender(self.request_id, body.kv_transfer_params)
            extra = {**extra, "hold_blocks": True, "kv_push": self.pusher}
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
        _add_batch_sizes(body, last)
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
        _add_batch_sizes(chunk, last)
        return chunk


def _add_batch_sizes(body: dict, last: RequestOutput) -> None:
    """The fleet extension: the smallest and largest running batch among the steps that produced the answer's
    tokens (canary probes record the batch condition they were served at). OpenAI clients ignore it."""
    if last.batch_size_min is not None and last.batch_size_max is not None:
        body[RESPONSE_EXTENSION] = {"batch_size_min": last.batch_size_min, "batch_size_max": last.batch_size_max}


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
