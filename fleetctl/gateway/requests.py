"""Client requests: parse and validate a /v1/completions or /v1/chat/completions body, and compute its prompt.

Validation uses the engine contract's request types (engine.protocol), so a bad field is a 400 naming it,
exactly as the engines would answer, before any engine is bothered. Only checks that hold for every backend
are made here (types and ranges, stream_options without stream, top_logprobs without logprobs, min_tokens
above max_tokens); features a particular engine lacks are refused by that engine, and its 4xx is passed on.

The body is forwarded as the client sent it (vLLM-only fields included); the gateway changes only what
P/D and cross-node KV fetch need (engine.protocol's models drop fields they do not know, so they are never
re-serialised). A client's own `kv_transfer_params` is dropped: it is the gateway's word to its engines (where
to pull K/V from, which peer to fetch blocks from), and an engine follows it with the fleet's engine key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from engine.protocol import ChatCompletionRequest, CompletionRequest, param_from_loc
from fleetctl.gateway.errors import BadRequest
from fleetctl.gateway.tokenization import PromptTokenizer

CHAT, COMPLETION = "chat", "completion"
PATHS = {CHAT: "/v1/chat/completions", COMPLETION: "/v1/completions"}


@dataclass(frozen=True)
class ClientRequest:
    kind: str  # "chat" | "completion"
    body: dict[str, Any]  # as the client sent it
    parsed: ChatCompletionRequest | CompletionRequest

    @property
    def path(self) -> str:
        return PATHS[self.kind]

    @property
    def model(self) -> str | None:
        return self.parsed.model

    @property
    def stream(self) -> bool:
        return self.parsed.stream

    @property
    def max_tokens(self) -> int | None:
        return self.parsed.requested_max_tokens

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == CHAT else "prompt"


def decode_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}", param="body") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", param="body")
    return body


def parse_request(kind: str, raw: bytes) -> ClientRequest:
    body = decode_json(raw)
    body.pop("kv_transfer_params", None)  # the gateway's to set (module doc)
    model_type = ChatCompletionRequest if kind == CHAT else CompletionRequest
    try:
        parsed = model_type.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = param_from_loc(first.get("loc", ()))
        raise BadRequest(f"{param}: {first.get('msg')}", param=param) from None
    request = ClientRequest(kind, body, parsed)
    check_request(request)
    return request


def check_request(request: ClientRequest) -> None:
    parsed = request.parsed
    if parsed.stream_options is not None and not parsed.stream:
        raise BadRequest("stream_options can only be set if stream is true", param="stream_options")
    if isinstance(parsed, ChatCompletionRequest) and parsed.top_logprobs is not None and not parsed.logprobs:
        raise BadRequest("top_logprobs can only be set if logprobs is true", param="top_logprobs")
    if isinstance(parsed, CompletionRequest):
        prompt = parsed.prompt
        if isinstance(prompt, list) and not prompt:
            raise BadRequest("the prompt is empty", param="prompt")
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) and len(prompt) != 1:
            raise BadRequest("only one prompt per request is supported", param="prompt")
    max_tokens = request.max_tokens
    if max_tokens is not None and parsed.min_tokens > max_tokens:
        raise BadRequest(f"min_tokens ({parsed.min_tokens}) must be less than or equal to max_tokens ({max_tokens})",
                         param="min_tokens")


def resolve_model(request: ClientRequest, models: Mapping[str, Any]) -> str:
    """The model asked for; a request without one is served by the only model, if there is just one."""
    if request.model is not None:
        return request.model
    if len(models) == 1:
        return next(iter(models))
    raise BadRequest("model is required", param="model")


async def prompt_token_ids(request: ClientRequest, tokenizer: PromptTokenizer) -> list[int]:
    parsed = request.parsed
    if isinstance(parsed, ChatCompletionRequest):
        return await tokenizer.chat(parsed.chat_messages(), parsed.add_generation_prompt)
    prompt = parsed.single_prompt
    if isinstance(prompt, str):
        return await tokenizer.text(prompt)
    return list(prompt)
