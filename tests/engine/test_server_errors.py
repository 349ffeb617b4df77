"""The engine app's error contract over an engine stub (no model): the OpenAPI document declares every route's
error responses with the OpenAI-style error body, and bad input the route cannot serve (empty chat messages,
NUL, lone surrogates, NaN) is a 400 naming the field, in that body, never a 500."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from engine.errors import ErrorBody
from engine.reference.config import EngineConfig
from engine.contract.outputs import SchedulerStats
from engine.reference.server import build_app

API_KEY = "k"
AUTH = {"authorization": f"Bearer {API_KEY}"}


class StrictTokenizer:
    """Refuses what Hugging Face tokenizers refuse: an empty chat, and text that is not valid UTF-8."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        text.encode("utf-8")  # a lone surrogate raises here, as the real tokenizer raises a TypeError
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False) -> str:
        if not messages:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        return "".join(m["content"] for m in messages)

    def __len__(self) -> int:
        return 0x110000


class IdleEngine:
    """Enough of an engine for the app to start; these tests never generate."""

    block_size = 16
    num_blocks = 8
    kv_dtype = torch.float32
    kv_block_shape = (1, 2, 16, 1, 4)
    ready = True

    def __init__(self) -> None:
        self.tokenizer = StrictTokenizer()

    def add_step_listener(self, fn) -> None:
        pass

    def stats(self) -> SchedulerStats:
        return SchedulerStats()


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(build_app(IdleEngine(), EngineConfig(api_key=API_KEY)), raise_server_exceptions=False)


# --- the OpenAPI document ------------------------------------------------------------------------------

# What each route can answer besides success (500 is always possible; "default" covers the framework's own).
EXPECTED_ERRORS = {
    ("get", "/v1/models"): {401, 503},
    ("post", "/v1/completions"): {400, 401, 502, 503},
    ("post", "/v1/chat/completions"): {400, 401, 502, 503},
    ("get", "/health"): {503},
    ("get", "/metrics"): set(),
    ("get", "/v1/fleet/config"): set(),
    ("post", "/tokenize"): {400},
    ("post", "/detokenize"): {400},
    ("post", "/reset_prefix_cache"): {401},
    ("post", "/drain"): {401},
    ("post", "/kv/pull"): {400, 401},
    ("post", "/kv/push"): {400, 401},
    ("post", "/kv/release"): {400, 401},
}


def test_every_route_declares_its_error_responses(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    routes = {(method, path): op for path, ops in schema["paths"].items() for method, op in ops.items()}
    assert set(routes) == set(EXPECTED_ERRORS)  # a new route must say what errors it returns
    for route, op in routes.items():
        declared = {code for code in op["responses"] if code[0] in "45"}
        assert declared == {str(code) for code in EXPECTED_ERRORS[route] | {500}}, route
        assert "default" in op["responses"], route
        assert "422" not in op["responses"], route  # validation errors are 400, never FastAPI's 422


def test_error_responses_carry_the_error_body_schema(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert schema["components"]["schemas"]["ErrorBody"]["required"] == ["error"]
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert set(detail["properties"]) == {"message", "type", "param", "code"}
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            for code, response in op["responses"].items():
                if code[0] not in "45d" or (path, code) == ("/health", "503"):  # /health's 503 has no body
                    continue
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody", (method, path, code)


# --- bad input is a 400 naming the field ---------------------------------------------------------------

BAD_REQUESTS = [
    ("/tokenize", b'{"messages": []}', "messages"),
    ("/tokenize", b'{"prompt": "a\\ud800b"}', "prompt"),
    ("/tokenize", b'{"prompt": "a\\u0000b"}', "prompt"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "\\udc00"}]}', "messages.0.content"),
    ("/detokenize", b'{"tokens": [-1]}', "tokens.0"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}', "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "top_p": Infinity}', "top_p"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4294967296}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["\\u0000"]}', "stop"),
    ("/v1/completions", b'{"prompt": "hi", "kv_transfer_params": {"\\ud800": 1}}', "kv_transfer_params"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi", "name": "\\u0000"}]}',
     "messages.0.name"),
    ("/kv/release", b'{"request_id": "\\ud800"}', "request_id"),
    ("/kv/pull", b'{"request_id": "r", "block_ids": [-3]}', "block_ids.0"),
]


@pytest.mark.parametrize("path,raw,field", BAD_REQUESTS, ids=[f"{p}:{f}" for p, _, f in BAD_REQUESTS])
def test_bad_input_is_a_400_naming_the_field(client: TestClient, path: str, raw: bytes, field: str) -> None:
    response = client.post(path, content=raw, headers={**AUTH, "content-type": "application/json"})
    assert response.status_code == 400, response.text
    body = ErrorBody.model_validate(response.json())
    assert body.error.param == field and body.error.code == 400 and body.error.type == "BadRequestError"
    assert body.error.message.startswith(f"{field}: ")


def test_tokenize_still_serves_good_input(client: TestClient) -> None:
    response = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hé"}]})
    assert response.status_code == 200 and response.json()["tokens"] == [ord("h"), ord("é")]


def test_unknown_routes_and_methods_answer_in_the_error_shape(client: TestClient) -> None:
    missing = client.get("/v2/nothing")
    assert missing.status_code == 404
    assert ErrorBody.model_validate(missing.json()).error.type == "NotFoundError"
    wrong_method = client.get("/tokenize")
    assert wrong_method.status_code == 405 and ErrorBody.model_validate(wrong_method.json()).error.code == 405
