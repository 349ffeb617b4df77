"""OpenAI-compatible request types with vLLM's extras, validated so that every error names the bad field.

Two layers of checks:
- pydantic checks types and ranges (`temperature >= 0`, `top_p in (0, 1]`, `logprobs <= 20`, ...). Every number
  is bounded to what it means (token counts and ids fit 32 bits, a seed 64) and finite (no NaN or infinity);
  every string, including those inside kv_transfer_params, refuses a NUL or an unpaired surrogate
  (engine.contract.bounds), so nothing a tokenizer or JSON writer would choke on gets past the door. A failure
  is a FastAPI RequestValidationError whose `loc` names the field; `param_from_loc` turns it into the
  `param` of the OpenAI error body, and the server answers 400 (as vLLM does), not FastAPI's 422.
- `check(served_model_name)` checks what pydantic cannot see field by field (stream_options without stream,
  top_logprobs without logprobs, n > 1, echo, an unknown model) and raises `engine.errors.InvalidRequest`.

`to_sampling_params(max_tokens)` maps a valid request onto the engine's SamplingParams; `resolve_max_tokens`
applies vLLM's default (whatever the context window leaves) once the prompt length is known.
The response half renders OpenAI's shapes: usage, choices, chunks, and logprobs (`LogprobFormatter`).
Nothing here imports torch: the gateway validates with the same types.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.contract.bounds import INT32_MAX, Count32, Finite, Fraction, Int64, NonNegative, SafeJson, SafeStr
from engine.errors import ContextLengthExceeded, EngineError, InvalidRequest
from engine.contract.outputs import TokenLogprob
from engine.contract.sampling_params import SamplingParams

MAX_LOGPROBS = 20  # vLLM's --max-logprobs default

# A number of tokens, or a token id: no context window or vocabulary comes near 2**31.
TokenCount = Annotated[int, Field(ge=1, le=INT32_MAX)]
TokenId = Count32
JsonObject = dict[SafeStr, SafeJson]  # free-form (kv_transfer_params, tools): only its strings are checked


class _Lenient(BaseModel):
    # vLLM ignores fields it does not know (with a warning); so do we.
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Lenient):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingRequest(_Lenient):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    prompt_field: ClassVar[str] = "prompt"  # the field a too-long prompt is reported against
    model: SafeStr | None = None
    max_tokens: TokenCount | None = None
    temperature: NonNegative | None = None
    top_p: Fraction | None = Field(default=None, gt=0.0)
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX)  # -1 and 0: disabled
    min_p: Fraction | None = None
    seed: Int64 | None = None
    stop: SafeStr | list[SafeStr] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    min_tokens: Count32 = 0
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=INT32_MAX)
    echo: bool = False
    kv_transfer_params: JsonObject | None = None
    return_tokens_as_token_ids: bool = False
    # Accepted for compatibility; only their neutral values are supported.
    presence_penalty: Finite | None = None
    frequency_penalty: Finite | None = None
    repetition_penalty: Finite | None = None
    best_of: Count32 | None = None
    use_beam_search: bool = False
    prompt_logprobs: Count32 | None = None
    user: SafeStr | None = None

    def check(self, served_model_name: str) -> None:
        """Cross-field and server-dependent checks; raise InvalidRequest naming the field."""
        if self.model is not None and self.model != served_model_name:
            raise InvalidRequest(f"The model `{self.model}` does not exist.", param="model")
        if self.n != 1:
            raise InvalidRequest("only n=1 is supported", param="n")
        if self.echo:
            raise InvalidRequest("echo is not supported", param="echo")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("stream_options can only be set if stream is true", param="stream_options")
        self._check_unsupported()
        max_tokens = self.requested_max_tokens
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise InvalidRequest(
                f"min_tokens ({self.min_tokens}) must be less than or equal to max_tokens ({max_tokens})",
                param="min_tokens",
            )

    def _check_unsupported(self) -> None:
        neutral = {
            "presence_penalty": (None, 0.0),
            "frequency_penalty": (None, 0.0),
            "repetition_penalty": (None, 1.0),
            "best_of": (None, 1),
            "use_beam_search": (False,),
            "prompt_logprobs": (None,),
        }
        for name, allowed in neutral.items():
            if getattr(self, name) not in allowed:
                raise InvalidRequest(f"{name} is not supported by this engine", param=name)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """Top logprobs per token for SamplingParams (None = no logprobs)."""
        raise NotImplementedError

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def remote_decode(self) -> bool:
        """P/D prefill side: the request's K/V is to be handed to a decode engine."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_decode"))

    @property
    def remote_prefill(self) -> bool:
        """P/D decode side: the request's prompt K/V was computed by a prefill engine."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_prefill"))

    def resolve_max_tokens(self, prompt_len: int, max_model_len: int) -> int:
        """max_tokens, defaulting to what the context window leaves; ContextLengthExceeded if nothing does."""
        if prompt_len >= max_model_len:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                f"{prompt_len} tokens; it must leave room for at least one output token.",
                param=self.prompt_field,
            )
        requested = self.requested_max_tokens
        return max_model_len - prompt_len if requested is None else requested

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            seed=self.seed,
            stop=self.stop_list,
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=self.num_logprobs,
        )


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions. One prompt (a string or token ids); a batch of more than one is refused."""

    prompt: SafeStr | list[TokenId] | list[SafeStr] | list[list[TokenId]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    suffix: SafeStr | None = None

    def check(self, served_model_name: str) -> None:
        super().check(served_model_name)
        if self.suffix:
            raise InvalidRequest("suffix is not supported", param="suffix")
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise InvalidRequest("the prompt is empty", param="prompt")
            if isinstance(self.prompt[0], (str, list)) and len(self.prompt) != 1:
                raise InvalidRequest("only one prompt per request is supported", param="prompt")

    @property
    def single_prompt(self) -> str | list[int]:
        """The prompt as text or token ids (a one-element batch unwrapped)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            return prompt[0]
        return prompt

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs


class ContentPart(_Lenient):
    type: Literal["text"]
    text: SafeStr


class ChatMessage(_Lenient):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: SafeStr | list[ContentPart] | None = None
    name: SafeStr | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions. Text content only; the prompt is the tokenizer's chat template."""

    prompt_field: ClassVar[str] = "messages"
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: TokenCount | None = None
    add_generation_prompt: bool = True
    tools: list[JsonObject] | None = None

    def check(self, served_model_name: str) -> None:
        super().check(served_model_name)
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs can only be set if logprobs is true", param="top_logprobs")
        if self.tools:
            raise InvalidRequest("tools are not supported", param="tools")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

    def chat_messages(self) -> list[dict[str, str]]:
        """Messages as the tokenizer's chat template wants them."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]


class TokenizeRequest(_Lenient):
    """POST /tokenize: a prompt or chat messages (at least one: a chat template has nothing to render
    from none)."""

    model: SafeStr | None = None
    prompt: SafeStr | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool = True

    def check(self, served_model_name: str) -> None:
        if self.model is not None and self.model != served_model_name:
            raise InvalidRequest(f"The model `{self.model}` does not exist.", param="model")
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("give exactly one of prompt or messages", param="prompt")


class DetokenizeRequest(_Lenient):
    """POST /detokenize: token ids back to text."""

    model: SafeStr | None = None
    tokens: list[TokenId]


# --- errors --------------------------------------------------------------------------------------------

_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "function-plain"}


def param_from_loc(loc: tuple | list) -> str:
    """A pydantic error location as a dotted field name: ("body", "messages", 0, "role") -> "messages.0.role".

    Union-member tags pydantic inserts ("str", "list[int]", "ContentPart") are dropped; a bad dict key names
    the dict (the key itself may be what cannot be printed); a location with no field (malformed JSON) is
    "body"."""
    parts = [p for p in loc if p != "body"]
    names: list[str] = []
    for part in parts:
        if part == "[key]":
            if names:
                names.pop()
            continue
        if isinstance(part, int):
            if names:  # a list index after a field; a JSON-decode position has no field before it
                names.append(str(part))
            continue
        text = str(part)
        if "[" in text or text in _TYPE_TAGS or text[:1].isupper():
            continue
        names.append(text)
    return ".".join(names) if names else "body"


def error_body(message: str, param: str | None, status: int = 400, error_type: str = "BadRequestError") -> dict:
    """The OpenAI-style error body (engine.errors.ErrorBody's shape)."""
    return EngineError.body(message, param, status, error_type)


# --- responses ------------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass
class ResponseHeader:
    """What every response and chunk of one request repeats."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def fields(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


class LogprobFormatter:
    """Renders TokenLogprobs in OpenAI's shapes (chat: `content` entries; completions: parallel lists)."""

    def __init__(self, token_text: Callable[[int], str], as_token_ids: bool = False):
        self._token_text = token_text
        self._as_token_ids = as_token_ids
        self.text_offset = 0  # completions: running offset of the next token in the generated text

    def token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self._as_token_ids else self._token_text(token_id)

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self.token(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}

    def chat(self, logprobs: list[TokenLogprob]) -> dict:
        content = []
        for lp in logprobs:
            entry = self._entry(lp.token_id, lp.logprob)
            entry["top_logprobs"] = [self._entry(tid, value) for tid, value in lp.top]
            content.append(entry)
        return {"content": content}

    def completion(self, logprobs: list[TokenLogprob]) -> dict:
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for lp in logprobs:
            text = self.token(lp.token_id)
            tokens.append(text)
            token_logprobs.append(_finite(lp.logprob))
            top = {self.token(tid): _finite(value) for tid, value in lp.top}
            top.setdefault(text, _finite(lp.logprob))  # vLLM: the top k plus the sampled token
            tops.append(top)
            offsets.append(self.text_offset)
            self.text_offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _finite(value: float) -> float:
    """JSON has no -inf: clamp as vLLM does (-9999.0)."""
    return max(value, -9999.0)


def completion_choice(text: str, logprobs: dict | None, finish_reason: str | None, stop_reason: Any) -> dict:
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}


def chat_choice(text: str, logprobs: dict | None, finish_reason: str | None, stop_reason: Any) -> dict:
    return {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def chat_delta_choice(delta: dict, logprobs: dict | None, finish_reason: str | None, stop_reason: Any) -> dict:
    return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}
