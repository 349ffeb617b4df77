"""The engine driven by the `openai` Python SDK: if the SDK parses it, OpenAI clients work unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING

import openai
import pytest

if TYPE_CHECKING:
    from conftest import EngineProcess

MESSAGES = [{"role": "user", "content": "Write one sentence about mountains."}]


@pytest.fixture(scope="module")
def client(tiny_engine: EngineProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_engine.url}/v1", api_key=tiny_engine.api_key, max_retries=0)


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_chat(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                              extra_body={"ignore_eos": True})
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 6
    assert response.usage.total_tokens == response.usage.prompt_tokens + 6


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_chat_logprobs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                              logprobs=True, top_logprobs=2)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)


def test_completions_with_logprobs(client: openai.OpenAI) -> None:
    response = client.completions.create(model="tiny", prompt="The sea is", max_tokens=5, temperature=0, logprobs=3,
                                         extra_body={"ignore_eos": True, "top_k": 10})
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == 5
    assert all(len(top) >= 3 for top in logprobs.top_logprobs)
    assert "".join(logprobs.tokens) == response.choices[0].text


def test_completions_stream(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="tiny", prompt="The sea is", max_tokens=5, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    whole = client.completions.create(model="tiny", prompt="The sea is", max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_sdk_errors(client: openai.OpenAI, tiny_engine: EngineProcess) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=-1)
    assert err.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MESSAGES, n=2)
    assert err.value.body["param"] == "n"
    bad_key = openai.OpenAI(base_url=f"{tiny_engine.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
