"""The SSE layer of build_app over a scripted engine (no model): keep-alive comments while a stream waits,
errors the engine raises after the stream started reported in-band, and the in-flight count."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import torch
from fastapi.testclient import TestClient

from engine.errors import InvalidRequest
from engine.reference.config import EngineConfig
from engine.contract.outputs import RequestOutput, SchedulerStats
from engine.contract.sampling_params import SamplingParams
from engine.reference.server import build_app

KEEPALIVE_S = 0.05


class CharTokenizer:
    """One token per character."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False) -> str:
        return "".join(m["content"] for m in messages)

    def __len__(self) -> int:
        return 0x110000


class ScriptedEngine:
    """Yields `words` one by one, waiting `delay_s` before each; raises `error` instead of the last one if set."""

    block_size = 16
    num_blocks = 8
    kv_dtype = torch.float32
    kv_block_shape = (1, 2, 16, 1, 4)
    ready = True

    def __init__(self, words: list[str], delay_s: float, error: Exception | None = None):
        self.tokenizer = CharTokenizer()
        self.words = words
        self.delay_s = delay_s
        self.error = error
        self.requests: list[tuple[str, list[int], SamplingParams]] = []

    def add_step_listener(self, fn) -> None:
        pass

    def validate(self, prompt: list[int], params: SamplingParams) -> None:
        pass  # every scripted request is valid

    def stats(self) -> SchedulerStats:
        return SchedulerStats()

    async def generate(self, request_id: str, prompt: list[int], params: SamplingParams,
                       **kv) -> AsyncIterator[RequestOutput]:
        self.requests.append((request_id, prompt, params))
        for i, word in enumerate(self.words):
            await asyncio.sleep(self.delay_s)
            last = i == len(self.words) - 1
            if last and self.error is not None:
                raise self.error
            yield RequestOutput(request_id, [ord(word[0])], word, None, finished=last,
                                finish_reason="length" if last else None,
                                num_prompt_tokens=len(prompt), num_output_tokens=i + 1)


def client_for(engine: ScriptedEngine) -> TestClient:
    config = EngineConfig(keepalive_interval_s=KEEPALIVE_S)
    return TestClient(build_app(engine, config))


def sse_blocks(body: str) -> list[str]:
    return [b for b in body.split("\n\n") if b]


def test_keepalive_comments_while_waiting_for_tokens() -> None:
    engine = ScriptedEngine(["a", "b", "c"], delay_s=6 * KEEPALIVE_S)
    with client_for(engine) as client:
        body = client.post("/v1/completions", json={"prompt": "xy", "stream": True}).text
    blocks = sse_blocks(body)
    assert ": keep-alive" in blocks
    data = [json.loads(b[6:]) for b in blocks if b.startswith("data: {")]
    assert "".join(d["choices"][0]["text"] for d in data) == "abc"
    assert blocks[-1] == "data: [DONE]"


def test_no_keepalive_when_tokens_flow() -> None:
    engine = ScriptedEngine(["a", "b", "c"], delay_s=0)
    with client_for(engine) as client:
        body = client.post("/v1/completions", json={"prompt": "xy", "stream": True}).text
    assert ": keep-alive" not in body


def test_an_error_after_the_stream_started_is_reported_in_band() -> None:
    engine = ScriptedEngine(["a", "b"], delay_s=0.5, error=InvalidRequest("boom", param="prompt"))
    with client_for(engine) as client:
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    blocks = sse_blocks(response.text)
    errors = [json.loads(b[6:]) for b in blocks if b.startswith("data: {\"error\"")]
    assert errors == [{"error": {"message": "boom", "type": "BadRequestError", "param": "prompt", "code": 400}}]
    assert blocks[-1] == "data: [DONE]"


def test_an_early_engine_error_is_an_http_error() -> None:
    engine = ScriptedEngine(["a"], delay_s=0, error=InvalidRequest("bad prompt", param="prompt"))
    with client_for(engine) as client:
        response = client.post("/v1/completions", json={"prompt": "xy", "stream": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("stream", [False, True])
def test_in_flight_count_returns_to_zero(stream: bool) -> None:
    engine = ScriptedEngine(["a", "b"], delay_s=0)
    app_client = client_for(engine)
    with app_client as client:
        assert client.post("/v1/completions", json={"prompt": "xy", "stream": stream}).status_code == 200
        assert client.post("/v1/completions", json={"prompt": "xy", "n": 2}).status_code == 400
        assert app_client.app.state.serving.lifecycle.in_flight == 0


def test_sampling_params_reach_the_engine() -> None:
    engine = ScriptedEngine(["a"], delay_s=0)
    with client_for(engine) as client:
        client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hey"}], "max_completion_tokens": 7, "temperature": 0.3,
            "top_k": 5, "stop": "zz", "logprobs": True, "top_logprobs": 4, "seed": 9, "ignore_eos": True,
        })
    _, prompt, params = engine.requests[0]
    assert prompt == [ord(c) for c in "hey"]
    assert (params.max_tokens, params.temperature, params.top_k, params.stop, params.logprobs, params.seed,
            params.ignore_eos) == (7, 0.3, 5, ["zz"], 4, 9, True)


def test_request_id_header_is_echoed_and_names_the_engine_request() -> None:
    engine = ScriptedEngine(["a"], delay_s=0)
    with client_for(engine) as client:
        response = client.post("/v1/completions", json={"prompt": "xy"}, headers={"x-request-id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    assert engine.requests[0][0].startswith("abc-123-")
    assert response.json()["id"] == f"cmpl-{engine.requests[0][0]}"
