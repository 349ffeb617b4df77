"""The OpenAI-compatible API of a real tiny engine process: shapes, streaming, logprobs, bad input, auth,
client disconnects. All requests go to the shared `tiny_engine` (API key TEST_API_KEY)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import EngineProcess

CHAT = [{"role": "user", "content": "Tell me about the sea."}]


def sse_events(body: str) -> list:
    """The JSON payloads of an SSE body, with "[DONE]" kept as a string; keep-alive comments skipped."""
    events = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def completion(engine: EngineProcess, **fields) -> dict:
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, **fields}
    response = engine.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


def chat(engine: EngineProcess, **fields) -> dict:
    response = engine.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, "temperature": 0, **fields})
    assert response.status_code == 200, response.text
    return response.json()


# --- shapes --------------------------------------------------------------------------------------------


def test_completion_response_shape_and_usage(tiny_engine: EngineProcess) -> None:
    response = tiny_engine.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                                                    "ignore_eos": True}, headers={"x-request-id": "my-id-1"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "my-id-1"
    body = response.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["index"] == 0 and isinstance(choice["text"], str) and choice["finish_reason"] == "length"
    prompt_tokens = len(tiny_engine.post("/tokenize", {"prompt": "Once upon a time"}).json()["tokens"])
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens, "completion_tokens": 6, "total_tokens": prompt_tokens + 6,
        "prompt_tokens_details": {"cached_tokens": body["usage"]["prompt_tokens_details"]["cached_tokens"]},
    }


def test_chat_response_shape(tiny_engine: EngineProcess) -> None:
    body = chat(tiny_engine, ignore_eos=True)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    prompt_tokens = tiny_engine.post("/tokenize", {"messages": CHAT}).json()["count"]
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["completion_tokens"] == 8


def test_generated_request_id_header(tiny_engine: EngineProcess) -> None:
    response = tiny_engine.post("/v1/completions", {"prompt": "hi", "max_tokens": 1})
    assert len(response.headers["x-request-id"]) >= 16


def test_token_id_prompt_equals_text_prompt(tiny_engine: EngineProcess) -> None:
    tokens = tiny_engine.post("/tokenize", {"prompt": "Once upon a time"}).json()["tokens"]
    assert completion(tiny_engine, prompt=tokens)["choices"][0]["text"] == completion(tiny_engine)["choices"][0]["text"]


def test_seed_makes_sampling_repeatable(tiny_engine: EngineProcess) -> None:
    first = completion(tiny_engine, temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    second = completion(tiny_engine, temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    assert first["choices"][0]["text"] == second["choices"][0]["text"]


def test_stop_string_cuts_the_text(tiny_engine: EngineProcess) -> None:
    full = completion(tiny_engine, max_tokens=12, ignore_eos=True, logprobs=0)["choices"][0]
    stop = full["logprobs"]["tokens"][2]
    cut = completion(tiny_engine, max_tokens=12, ignore_eos=True, stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["text"] == full["text"][: full["text"].index(stop)]


# --- streaming -----------------------------------------------------------------------------------------


def test_streamed_completion_equals_the_non_streamed_one(tiny_engine: EngineProcess) -> None:
    fields = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    whole = tiny_engine.post("/v1/completions", fields).json()
    streamed = {**fields, "stream": True, "stream_options": {"include_usage": True}}
    response = tiny_engine.post("/v1/completions", streamed)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 10


def test_streamed_chat_starts_with_the_role_and_ends_with_done(tiny_engine: EngineProcess) -> None:
    whole = chat(tiny_engine, ignore_eos=True)
    response = tiny_engine.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, "temperature": 0,
                                                         "ignore_eos": True, "stream": True})
    events = sse_events(response.text)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1])
    assert text == whole["choices"][0]["message"]["content"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e for e in events[:-1])  # no include_usage: no usage field at all


# --- logprobs ------------------------------------------------------------------------------------------


def test_chat_logprobs_shape(tiny_engine: EngineProcess) -> None:
    body = chat(tiny_engine, logprobs=True, top_logprobs=3, ignore_eos=True)
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 8
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3
        assert entry["logprob"] <= 0 and entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-6
        assert entry["token"] == entry["top_logprobs"][0]["token"]  # greedy picks the top token
    assert "".join(e["token"] for e in content) == body["choices"][0]["message"]["content"]


def test_completion_logprobs_shape(tiny_engine: EngineProcess) -> None:
    body = completion(tiny_engine, logprobs=2, ignore_eos=True)
    logprobs = body["choices"][0]["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 8
    assert all(2 <= len(top) <= 3 for top in logprobs["top_logprobs"])
    offsets = [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(8)]
    assert logprobs["text_offset"] == offsets
    assert "".join(logprobs["tokens"]) == body["choices"][0]["text"]


def test_return_tokens_as_token_ids(tiny_engine: EngineProcess) -> None:
    body = completion(tiny_engine, logprobs=1, return_tokens_as_token_ids=True, ignore_eos=True)
    tokens = body["choices"][0]["logprobs"]["tokens"]
    ids = [int(t.removeprefix("token_id:")) for t in tokens]
    assert tiny_engine.post("/detokenize", {"tokens": ids}).json()["prompt"] == body["choices"][0]["text"]


def test_no_logprobs_unless_asked(tiny_engine: EngineProcess) -> None:
    assert completion(tiny_engine)["choices"][0]["logprobs"] is None
    assert chat(tiny_engine)["choices"][0]["logprobs"] is None


# --- other endpoints -----------------------------------------------------------------------------------


def test_models_tokenize_detokenize(tiny_engine: EngineProcess) -> None:
    models = tiny_engine.get("/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == "tiny" and card["max_model_len"] == 2048 and card["owned_by"]
    tokenized = tiny_engine.post("/tokenize", {"prompt": "Hello world"}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] == 2048
    assert tiny_engine.post("/detokenize", {"tokens": tokenized["tokens"]}).json()["prompt"] == "Hello world"
    chat_tokens = tiny_engine.post("/tokenize", {"messages": CHAT}).json()
    assert chat_tokens["count"] > tokenized["count"]


def test_detokenize_refuses_unknown_ids(tiny_engine: EngineProcess) -> None:
    response = tiny_engine.post("/detokenize", {"tokens": [1, 10**9]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tokens"


def test_health_and_metrics_need_no_key(tiny_engine: EngineProcess) -> None:
    assert httpx.get(tiny_engine.url + "/health").status_code == 200
    assert httpx.get(tiny_engine.url + "/metrics").status_code == 200


def test_reset_prefix_cache(tiny_engine: EngineProcess) -> None:
    response = tiny_engine.post("/reset_prefix_cache")
    assert response.status_code == 200 and response.json() == {"reset": True}


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "test-key-123", "Bearer test-key-1234"])
def test_v1_requires_the_api_key(tiny_engine: EngineProcess, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    response = httpx.post(tiny_engine.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == 401
    assert httpx.get(tiny_engine.url + "/v1/models", headers=headers).status_code == 401


@pytest.mark.parametrize("path", ["/drain", "/reset_prefix_cache", "/kv/pull", "/kv/push", "/kv/release"])
def test_state_changing_routes_require_the_api_key(tiny_engine: EngineProcess, path: str) -> None:
    response = httpx.post(tiny_engine.url + path, json={"request_id": "x", "block_ids": []})
    assert response.status_code == 401
    assert httpx.get(tiny_engine.url + "/health").status_code == 200  # and the engine is not draining


def test_tokenizer_routes_are_open(tiny_engine: EngineProcess) -> None:
    assert httpx.post(tiny_engine.url + "/tokenize", json={"prompt": "hi"}).status_code == 200


# --- bad input: 400 naming the field, and the engine keeps serving --------------------------------------

LONG_PROMPT = list(range(100, 2200))  # 2100 tokens > max_model_len 2048

BAD_COMPLETIONS = [
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5000}, "max_tokens"),
    ({"logprobs": 21}, "logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "maybe"}}, "stream_options.include_usage"),
    ({"n": 2}, "n"),
    ({"echo": True}, "echo"),
    ({"model": "no-such-model"}, "model"),
    ({"prompt": LONG_PROMPT}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ({"stop": [1, 2]}, "stop"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
]

BAD_CHATS = [
    ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "word " * 2100}]}, "messages"),
    ({"model": "gpt-4"}, "model"),
    ({"n": 3}, "n"),
]


def assert_bad_request(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field, error
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]


@pytest.mark.parametrize("fields,field", BAD_COMPLETIONS, ids=[f for _, f in BAD_COMPLETIONS])
def test_bad_completion_is_400_naming_the_field(tiny_engine: EngineProcess, fields: dict, field: str) -> None:
    request = {"prompt": "Hello", "max_tokens": 4, **fields}
    assert_bad_request(tiny_engine.post("/v1/completions", request), field)
    assert completion(tiny_engine, max_tokens=2)["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.mark.parametrize("fields,field", BAD_CHATS, ids=[f for _, f in BAD_CHATS])
def test_bad_chat_is_400_naming_the_field(tiny_engine: EngineProcess, fields: dict, field: str) -> None:
    request = {"messages": CHAT, "max_tokens": 4, **fields}
    assert_bad_request(tiny_engine.post("/v1/chat/completions", request), field)
    assert chat(tiny_engine, max_tokens=2)["choices"][0]["finish_reason"] in ("length", "stop")


BAD_TOKENIZE = [
    (b'{"messages": []}', "messages"),
    (b'{"prompt": "a\\ud800"}', "prompt"),
    (b'{"messages": [{"role": "user", "content": "a\\u0000"}]}', "messages.0.content"),
]


@pytest.mark.parametrize("raw,field", BAD_TOKENIZE, ids=[f for _, f in BAD_TOKENIZE])
def test_bad_tokenize_is_400_naming_the_field(tiny_engine: EngineProcess, raw: bytes, field: str) -> None:
    response = tiny_engine.post("/tokenize", content=raw, headers={"content-type": "application/json"})
    assert_bad_request(response, field)
    assert tiny_engine.post("/tokenize", {"messages": CHAT}).status_code == 200


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
def test_malformed_body_is_400(tiny_engine: EngineProcess, raw: bytes) -> None:
    response = tiny_engine.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "body"
    assert completion(tiny_engine, max_tokens=1)["usage"]["completion_tokens"] == 1


def test_too_long_prompt_in_a_stream_is_a_400_not_a_broken_stream(tiny_engine: EngineProcess) -> None:
    response = tiny_engine.post("/v1/completions", {"prompt": LONG_PROMPT, "stream": True})
    assert_bad_request(response, "prompt")


# --- client disconnects free their blocks ---------------------------------------------------------------


# A 2000-token request takes seconds on the tiny model; an aborted one stops long before its end.
LONG_REQUEST = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True}


def test_streaming_client_disconnect_aborts_and_frees_blocks(tiny_engine: EngineProcess, metric_value) -> None:
    generated_before = tiny_engine.metric("vllm:generation_tokens_total")
    body = {**LONG_REQUEST, "stream": True}
    with tiny_engine.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert tiny_engine.metric("vllm:num_requests_running") == 1
        assert tiny_engine.metric("vllm:kv_cache_usage_perc") > 0
    samples = tiny_engine.wait_idle()
    assert metric_value(samples, "vllm:generation_tokens_total") - generated_before < 2000


def test_a_stream_left_before_its_response_started_is_aborted(launch_engine, metric_value) -> None:
    """The engine holds a stream's response up to a second for errors it finds early, and no write happens
    while it waits: it checks for the client between waits, so a client that left then does not keep the
    prefill running. A slow engine (16 prompt tokens and 100 ms a step) prefills these 144 tokens in about
    0.9 s, inside that second: unnoticed, the client's departure would let the request finish."""
    engine = launch_engine("--debug-step-delay-ms", "100", "--max-num-batched-tokens", "16")
    body = {"prompt": [100 + i for i in range(144)], "max_tokens": 1, "stream": True}
    with engine.client() as client, pytest.raises(httpx.ReadTimeout):  # httpx closes the connection
        client.post("/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.2))
    samples = engine.wait_idle()
    assert metric_value(samples, "vllm:request_success_total", finished_reason="abort") == 1
    assert metric_value(samples, "vllm:prompt_tokens_total") == 0  # its prefill never completed


def test_non_streaming_client_disconnect_aborts_and_frees_blocks(tiny_engine: EngineProcess, metric_value) -> None:
    generated_before = tiny_engine.metric("vllm:generation_tokens_total")
    with tiny_engine.client() as client, pytest.raises(httpx.ReadTimeout):
        # Give up while the request runs; httpx closes the connection.
        client.post("/v1/completions", json=LONG_REQUEST, timeout=httpx.Timeout(60, read=0.3))
    samples = tiny_engine.wait_idle()
    assert metric_value(samples, "vllm:generation_tokens_total") - generated_before < 2000
    assert completion(tiny_engine, max_tokens=2)["usage"]["completion_tokens"] == 2
