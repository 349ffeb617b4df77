"""One golden prompt through the gateway: a probe, pinned to a class revision or on the production path.

`send_probe` sends one non-streamed request to the gateway's /v1/chat/completions (a chat prompt) or
/v1/completions (a completion prompt) with the prompt's fixed sampling, the top-k logprobs at each position,
and `return_tokens_as_token_ids`, so the answer's tokens come back as `token_id:<id>` (docs/engine.md) rather
than as text that a tokenizer would have to map back. Headers: `x-fleet-probe: <kind>` (the gateway keeps
probes out of user metrics), `x-fleet-pin-class` when pinned, and the caller's (the client API key). From the
answer: the tokens and top-k logprobs, the text, the usage, `x-fleet-served-by` ("<class_ref> <engine>") and
the engine's batch-size report (`{"fleet": {"batch_size_max"}}`; None where the engine does not send it).

Batch conditions: with `fillers` > 0, that many streamed filler requests with the same pin go first, sampling
at temperature 1.0 with a seed and twice the probe's max_tokens, so they are still decoding while the probe
runs (how `fleetctl canary record` measures a class's noise at a batch condition; the controller's pinned
probes make their batch of golden prompts instead). With an engine pinned (`x-fleet-pin-engine`) a filler is
a completion of a few tokens (FILLER_PROMPT) on that engine: what makes the batch is its row, not its prompt,
and a short one costs a few tokens instead of the golden prompt's tens. Without one (nothing else pins the
engine) a filler repeats the probe's prompt, so prefix-cache locality sends it to the engine that will serve
the probe. The probe is sent once each filler has streamed its first token, and the fillers are cancelled when
it returns (closing a stream aborts the request on the engine). Fillers are marked `x-fleet-probe: filler`.

`prompt_token_count` asks the gateway's /fleet/route/explain (nothing is sent to an engine) how many tokens
the prompt is on the serving path, chat template included, for checking a golden set against a class's window.

Failures are `ProbeError`: a non-200 answer, a timeout (fillers included), an unreachable gateway, or an
answer that does not parse; the message says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Literal

import httpx

from engine.contract.faults import PIN_ENGINE_HEADER, PROBE_HEADER, RESPONSE_EXTENSION
from fleetctl.canary.types import GoldenPrompt, ProbeKind, ProbeOutput, TopLogprobs
from fleetctl.errors import FleetError

# The gateway's header names (fleetctl.gateway.class_choice / frontdoor, which this package may not import).
PIN_HEADER = "x-fleet-pin-class"
SERVED_BY_HEADER = "x-fleet-served-by"
FILLER = "filler"  # the x-fleet-probe value of a filler request
FILLER_PROMPT = "1, 2, 3,"  # an engine-pinned filler's prompt: a few tokens
TOKEN_ID_PREFIX = "token_id:"

ProbeFailure = Literal["status", "timeout", "unreachable", "malformed", "filler"]


class ProbeError(FleetError):
    """A probe that got no usable answer. `reason` says why; `http_status` and `detail` are the gateway's status
    and error message, if it answered."""

    status = 502
    code = "probe_failed"

    def __init__(self, message: str, *, reason: ProbeFailure, http_status: int | None = None,
                 detail: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.http_status = http_status
        self.detail = detail


async def send_probe(client: httpx.AsyncClient, gateway_url: str, model: str, prompt: GoldenPrompt, *,
                     kind: ProbeKind, pin: str | None = None, engine: str | None = None, fillers: int = 0,
                     headers: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> ProbeOutput:
    """`engine` (with `pin`): the probe and its fillers must be served by that engine of the revision."""
    url = gateway_url.rstrip("/") + endpoint_path(prompt)
    base = {**(headers or {}), **({PIN_HEADER: pin} if pin else {}), **({PIN_ENGINE_HEADER: engine} if engine else {})}
    what = f"{kind} probe {prompt.id!r}" + (f" pinned to {pin}" if pin else "") + (f" on {engine}" if engine else "")
    try:
        with _transport_errors(what, gateway_url, timeout_s):
            async with asyncio.timeout(timeout_s):
                async with _fillers_running(client, gateway_url, model, prompt, fillers, base, what,
                                            short=engine is not None):
                    started = time.monotonic()
                    response = await client.post(url, json=probe_body(model, prompt),
                                                 headers={**base, PROBE_HEADER: kind}, timeout=timeout_s)
                    latency_s = time.monotonic() - started
    except TimeoutError:
        raise ProbeError(f"{what}: timed out after {timeout_s:g}s" + (f" (with {fillers} fillers)" if fillers else ""),
                         reason="timeout") from None
    _refuse_unless_ok(response, what)
    return parse_answer(prompt, response, fillers=fillers, latency_s=latency_s, what=what)


async def prompt_token_count(client: httpx.AsyncClient, gateway_url: str, model: str, prompt: GoldenPrompt, *,
                             pin: str | None = None, headers: Mapping[str, str] | None = None,
                             timeout_s: float = 30.0) -> int:
    """The prompt's tokens as the gateway counts them for `pin`'s class. A prompt that leaves no room in the
    class's window is the gateway's 400 (a ProbeError with http_status 400 and its message)."""
    body: dict[str, Any] = {"model": model}
    body.update({"messages": prompt.messages} if prompt.messages is not None else {"prompt": prompt.prompt})
    what = f"counting the tokens of {prompt.id!r}"
    with _transport_errors(what, gateway_url, timeout_s):
        response = await client.post(gateway_url.rstrip("/") + "/fleet/route/explain", json=body, timeout=timeout_s,
                                     headers={**(headers or {}), **({PIN_HEADER: pin} if pin else {})})
    _refuse_unless_ok(response, what)
    try:
        return int(response.json()["num_prompt_tokens"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"{what}: malformed answer ({type(exc).__name__}: {exc})", reason="malformed") from None


def endpoint_path(prompt: GoldenPrompt) -> str:
    return "/v1/chat/completions" if prompt.messages is not None else "/v1/completions"


def probe_body(model: str, prompt: GoldenPrompt) -> dict[str, Any]:
    """The request: the prompt's sampling, top-k logprobs at each position, token ids instead of token text."""
    sampling = prompt.sampling
    body: dict[str, Any] = {"model": model, "temperature": sampling.temperature, "max_tokens": sampling.max_tokens,
                            "return_tokens_as_token_ids": True, "stream": False}
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if prompt.messages is not None:
        body.update(messages=prompt.messages, logprobs=True, top_logprobs=sampling.top_logprobs)
    else:
        body.update(prompt=prompt.prompt, logprobs=sampling.top_logprobs)
    return body


def filler_body(model: str, prompt: GoldenPrompt, index: int, *, short: bool = False) -> dict[str, Any]:
    """A filler: sampled, streamed, and long enough to be decoding for as long as the probe is (2 x its
    max_tokens + 16, never stopping early at EOS). `short` (its engine pinned): a completion of FILLER_PROMPT;
    otherwise the probe's own prompt, so that it lands on the probe's engine."""
    body: dict[str, Any] = {"model": model, "temperature": 1.0, "seed": index + 1, "stream": True,
                            "max_tokens": 2 * prompt.sampling.max_tokens + 16, "ignore_eos": True}
    if short:
        body["prompt"] = FILLER_PROMPT
    elif prompt.messages is not None:
        body["messages"] = prompt.messages
    else:
        body["prompt"] = prompt.prompt
    return body


def filler_path(prompt: GoldenPrompt, *, short: bool) -> str:
    return "/v1/completions" if short else endpoint_path(prompt)


# --- reading the answer -----------------------------------------------------------------------------------------

def parse_answer(prompt: GoldenPrompt, response: httpx.Response, *, fillers: int = 0, latency_s: float = 0.0,
                 what: str = "probe") -> ProbeOutput:
    try:
        body = response.json()
        choice = body["choices"][0]
        if prompt.messages is not None:
            text, tokens, top = _chat_logprobs(choice, prompt.sampling.top_logprobs)
        else:
            text, tokens, top = _completion_logprobs(choice, prompt.sampling.top_logprobs)
        usage = body.get("usage") or {}
        class_ref, engine = served_by(response.headers.get(SERVED_BY_HEADER))
        return ProbeOutput(
            prompt_id=prompt.id, tokens=tokens, text=storable(text), top_logprobs=top, batch_size=batch_size_max(body),
            fillers=fillers, class_ref=class_ref, engine=engine, prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or len(tokens)), latency_s=latency_s)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ProbeError(f"{what}: malformed answer ({type(exc).__name__}: {exc})", reason="malformed") from None


def _chat_logprobs(choice: dict[str, Any], k: int) -> tuple[str, list[int], list[TopLogprobs]]:
    content = choice["logprobs"]["content"]
    tokens = [token_id(entry["token"]) for entry in content]
    top = [_best([(token_id(t["token"]), float(t["logprob"])) for t in entry["top_logprobs"]], k) for entry in content]
    return choice["message"]["content"] or "", tokens, top


def _completion_logprobs(choice: dict[str, Any], k: int) -> tuple[str, list[int], list[TopLogprobs]]:
    logprobs = choice["logprobs"]
    tokens = [token_id(t) for t in logprobs["tokens"]]
    # each position's map holds the top k plus the sampled token (k + 1 entries when it is not among them)
    top = [_best([(token_id(t), float(lp)) for t, lp in position.items()], k) for position in logprobs["top_logprobs"]]
    if len(top) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(top)} top_logprobs positions")
    return choice["text"] or "", tokens, top


def _best(pairs: list[tuple[int, float]], k: int) -> TopLogprobs:
    return sorted(pairs, key=lambda pair: -pair[1])[:k]


def token_id(rendered: str) -> int:
    """'token_id:42' -> 42 (what return_tokens_as_token_ids renders)."""
    if not isinstance(rendered, str) or not rendered.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"token {rendered!r} is not rendered as {TOKEN_ID_PREFIX}<id>")
    return int(rendered.removeprefix(TOKEN_ID_PREFIX))


def served_by(value: str | None) -> tuple[str | None, str | None]:
    """'<class_ref> <engine>' -> (class_ref, engine); '-' (no engine answered) and a missing header -> None."""
    parts = (value or "").split()
    class_ref = parts[0] if parts and parts[0] != "-" else None
    engine = parts[1] if len(parts) > 1 and parts[1] != "-" else None
    return class_ref, engine


def batch_size_max(body: dict[str, Any]) -> int | None:
    """The largest running batch among the engine steps that served the request, if the engine said."""
    extension = body.get(RESPONSE_EXTENSION)
    value = extension.get("batch_size_max") if isinstance(extension, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error") or {}
        return " ".join(str(error.get("message") or response.reason_phrase).split())
    except (ValueError, AttributeError):
        return response.reason_phrase or "no body"


# --- fillers ----------------------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def _fillers_running(client: httpx.AsyncClient, gateway_url: str, model: str, prompt: GoldenPrompt,
                           count: int, headers: dict[str, str], what: str, *, short: bool) -> AsyncIterator[None]:
    """`count` streamed fillers, each decoding, while the body runs; cancelled afterwards."""
    if count <= 0:
        yield
        return
    url = gateway_url.rstrip("/") + filler_path(prompt, short=short)
    started = [asyncio.Event() for _ in range(count)]
    tasks = [asyncio.create_task(_filler(client, url, filler_body(model, prompt, i, short=short),
                                         {**headers, PROBE_HEADER: FILLER}, started[i]), name=f"canary-filler-{i}")
             for i in range(count)]
    try:
        await _all_started(tasks, started, what)
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _all_started(tasks: list[asyncio.Task[None]], started: list[asyncio.Event], what: str) -> None:
    """Return once every filler has streamed a token; a filler that ends or fails first is a ProbeError."""
    waits = [asyncio.create_task(event.wait()) for event in started]
    try:
        pending = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending | {t for t in tasks if not t.done()},
                                               return_when=asyncio.FIRST_COMPLETED)
            for index, task in enumerate(tasks):
                if task in done and not started[index].is_set():
                    error = task.exception() if not task.cancelled() else None
                    raise ProbeError(f"{what}: filler {index} ended before streaming a token"
                                     + (f" ({error})" if error else ""), reason="filler")
            pending = {w for w in waits if not w.done()}
    finally:
        for wait in waits:
            wait.cancel()


async def _filler(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
                  started: asyncio.Event) -> None:
    # no timeout of its own: send_probe's deadline bounds the fillers with the probe
    async with client.stream("POST", url, json=body, headers=headers, timeout=None) as response:
        if response.status_code != 200:
            await response.aread()
            raise ProbeError(f"the gateway answered {response.status_code}: {_error_message(response)}",
                             reason="filler", http_status=response.status_code)
        async for line in response.aiter_lines():
            if not started.is_set() and _carries_token(line):
                started.set()


def _carries_token(line: str) -> bool:
    """An SSE data line with generated text (chat's opening role delta and keep-alive comments do not count)."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return False
    try:
        choices = json.loads(line.removeprefix("data: ")).get("choices") or []
    except ValueError:
        return False
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
    return bool(choice.get("text") or delta.get("content") or choice.get("finish_reason"))


@contextlib.contextmanager
def _transport_errors(what: str, gateway_url: str, timeout_s: float) -> Iterator[None]:
    """httpx's timeouts and transport failures as ProbeErrors saying which."""
    try:
        yield
    except httpx.TimeoutException:
        raise ProbeError(f"{what}: timed out after {timeout_s:g}s", reason="timeout") from None
    except httpx.HTTPError as exc:
        raise ProbeError(f"{what}: gateway at {gateway_url} unreachable ({type(exc).__name__})",
                         reason="unreachable") from None


def _refuse_unless_ok(response: httpx.Response, what: str) -> None:
    if response.status_code != 200:
        detail = _error_message(response)
        raise ProbeError(f"{what}: the gateway answered {response.status_code}: {detail}",
                         reason="status", http_status=response.status_code, detail=detail)


def storable(text: str) -> str:
    """The answer text with NUL characters replaced (U+FFFD): a store refuses them, and a model with random
    weights emits them. The token ids, not the text, are what a probe is compared by."""
    return text.replace("\x00", "\ufffd")
