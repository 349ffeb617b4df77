"""engine.protocol without a server: validation names the field, requests map onto SamplingParams,
logprobs render in OpenAI's shapes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from engine.errors import ContextLengthExceeded, InvalidRequest, printable
from engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LogprobFormatter,
    TokenizeRequest,
    error_body,
    param_from_loc,
)
from engine.contract.outputs import TokenLogprob

MESSAGES = [{"role": "user", "content": "hi"}]


def completion(**fields) -> CompletionRequest:
    return CompletionRequest(prompt="hello", **fields)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **fields)


def field_of(exc: ValidationError) -> str:
    return param_from_loc(exc.errors()[0]["loc"])


# --- ranges (pydantic) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fields,field", [
    ({"temperature": -0.01}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.01}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"min_p": -0.1}, "min_p"), ({"min_p": 1.1}, "min_p"), ({"max_tokens": 0}, "max_tokens"),
    ({"logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs"), ({"min_tokens": -1}, "min_tokens"), ({"n": 0}, "n"),
    ({"seed": 2**63}, "seed"), ({"stream_options": {"include_usage": "perhaps"}}, "stream_options.include_usage"),
])
def test_completion_ranges_name_the_field(fields: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        completion(**fields)
    assert field_of(err.value) == field


@pytest.mark.parametrize("fields,field", [
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"), ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": []}, "messages"), ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content"),
])
def test_chat_ranges_name_the_field(fields: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest(**{"messages": MESSAGES, **fields})
    assert field_of(err.value) == field


@given(st.floats(min_value=0, max_value=100))
def test_any_non_negative_temperature_is_valid(temperature: float) -> None:
    assert completion(temperature=temperature).to_sampling_params(4).temperature == temperature


@given(st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False))
def test_any_negative_temperature_is_refused(temperature: float) -> None:
    with pytest.raises(ValidationError):
        completion(temperature=temperature)


# --- bounds: every number means something, every string can be encoded ----------------------------------

NUL, SURROGATE = "a\x00b", "a\ud800b"


@pytest.mark.parametrize("fields,field", [
    ({"prompt": NUL}, "prompt"), ({"prompt": SURROGATE}, "prompt"), ({"prompt": ["ok", NUL]}, "prompt"),
    ({"stop": NUL}, "stop"), ({"stop": ["x", SURROGATE]}, "stop"), ({"suffix": NUL}, "suffix"),
    ({"model": SURROGATE}, "model"), ({"user": NUL}, "user"),
    ({"kv_transfer_params": {"push_to": NUL}}, "kv_transfer_params.push_to"),
    ({"kv_transfer_params": {"nested": {"deep": [SURROGATE]}}}, "kv_transfer_params.nested"),
    ({"kv_transfer_params": {NUL: True}}, "kv_transfer_params"),
])
def test_completion_strings_refuse_nul_and_lone_surrogates(fields: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        CompletionRequest(**{"prompt": "hello", **fields})
    assert field_of(err.value) == field


@pytest.mark.parametrize("message,field", [
    ({"role": "user", "content": NUL}, "messages.0.content"),
    ({"role": "user", "content": SURROGATE}, "messages.0.content"),
    ({"role": "user", "content": [{"type": "text", "text": NUL}]}, "messages.0.content"),
    ({"role": "user", "content": "hi", "name": SURROGATE}, "messages.0.name"),
])
def test_chat_strings_refuse_nul_and_lone_surrogates(message: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest(messages=[message])
    assert field_of(err.value) == field


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                  "repetition_penalty"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_floats_refuse_nan_and_infinity(name: str, value: float) -> None:
    with pytest.raises(ValidationError) as err:
        completion(**{name: value})
    assert field_of(err.value) == name


@pytest.mark.parametrize("fields,field", [
    ({"max_tokens": 2**31}, "max_tokens"), ({"top_k": 2**31}, "top_k"), ({"min_tokens": 2**31}, "min_tokens"),
    ({"n": 2**31}, "n"), ({"best_of": 2**31}, "best_of"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"stop_token_ids": [-1]}, "stop_token_ids.0"), ({"stop_token_ids": [2**31]}, "stop_token_ids.0"),
    ({"seed": -(2**63) - 1}, "seed"), ({"prompt": [2**31]}, "prompt"), ({"prompt": [[-1]]}, "prompt"),
])
def test_integers_are_bounded_to_what_they_mean(fields: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        CompletionRequest(**{"prompt": "hello", **fields})
    assert field_of(err.value) == field


def test_the_bounds_keep_every_meaningful_value() -> None:
    request = completion(max_tokens=2**31 - 1, top_k=-1, seed=-(2**63), stop_token_ids=[0, 2**31 - 1],
                         temperature=0.0, top_p=1.0, min_p=0.0, kv_transfer_params={"remote_port": 8100})
    assert request.max_tokens == 2**31 - 1 and request.seed == -(2**63) and request.stop_token_ids[-1] == 2**31 - 1
    assert ChatCompletionRequest(messages=[{"role": "user", "content": "é ✓ 🌊"}]).chat_messages()[0]["content"] == "é ✓ 🌊"


@pytest.mark.parametrize("model,fields,field", [
    (TokenizeRequest, {"messages": []}, "messages"),
    (TokenizeRequest, {"prompt": SURROGATE}, "prompt"),
    (TokenizeRequest, {"messages": [{"role": "user", "content": NUL}]}, "messages.0.content"),
    (TokenizeRequest, {"prompt": "x", "model": NUL}, "model"),
    (DetokenizeRequest, {"tokens": [-1]}, "tokens.0"),
    (DetokenizeRequest, {"tokens": [2**31]}, "tokens.0"),
])
def test_tokenizer_requests_name_the_field(model: type, fields: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        model(**fields)
    assert field_of(err.value) == field


# --- cross-field checks --------------------------------------------------------------------------------


@pytest.mark.parametrize("request_,field", [
    (completion(n=2), "n"), (completion(echo=True), "echo"), (completion(model="other"), "model"),
    (completion(stream_options={"include_usage": True}), "stream_options"), (completion(suffix="!"), "suffix"),
    (completion(min_tokens=5, max_tokens=2), "min_tokens"), (completion(presence_penalty=0.5), "presence_penalty"),
    (completion(repetition_penalty=1.2), "repetition_penalty"), (completion(best_of=2), "best_of"),
    (completion(prompt_logprobs=1), "prompt_logprobs"), (CompletionRequest(prompt=["a", "b"]), "prompt"),
    (CompletionRequest(prompt=[]), "prompt"),
    (chat(top_logprobs=3), "top_logprobs"), (chat(tools=[{"type": "function"}]), "tools"), (chat(n=4), "n"),
    (chat(max_completion_tokens=3, min_tokens=4), "min_tokens"),
])
def test_checks_name_the_field(request_, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        request_.check("tiny")
    assert err.value.param == field and err.value.status_code == 400


def test_valid_requests_pass_the_checks() -> None:
    completion(model="tiny", stream=True, stream_options={"include_usage": True}, presence_penalty=0).check("tiny")
    chat(logprobs=True, top_logprobs=2, repetition_penalty=1.0).check("tiny")
    CompletionRequest(prompt=[[1, 2, 3]]).check("tiny")


def test_context_window() -> None:
    assert completion().resolve_max_tokens(prompt_len=10, max_model_len=100) == 90  # vLLM's default
    assert completion(max_tokens=5).resolve_max_tokens(10, 100) == 5
    with pytest.raises(ContextLengthExceeded) as err:
        completion().resolve_max_tokens(100, 100)
    assert err.value.param == "prompt"
    with pytest.raises(ContextLengthExceeded) as err:
        chat().resolve_max_tokens(150, 100)
    assert err.value.param == "messages"


# --- mapping onto SamplingParams -----------------------------------------------------------------------


def test_defaults_map_to_vllm_defaults() -> None:
    params = completion().to_sampling_params(16)
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.logprobs) == (1.0, 1.0, 0, 0.0, None)
    assert params.stop == [] and params.stop_token_ids == [] and params.max_tokens == 16


def test_completion_fields_map_one_to_one() -> None:
    request = completion(temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, seed=7, stop="END", stop_token_ids=[2],
                         ignore_eos=True, min_tokens=3, include_stop_str_in_output=True, logprobs=5)
    params = request.to_sampling_params(32)
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.seed) == (0.5, 0.9, 40, 0.05, 7)
    assert (params.stop, params.stop_token_ids, params.ignore_eos, params.min_tokens) == (["END"], [2], True, 3)
    assert params.include_stop_str_in_output and params.logprobs == 5 and params.max_tokens == 32


def test_chat_logprobs_and_max_completion_tokens() -> None:
    assert chat().num_logprobs is None
    assert chat(logprobs=True).num_logprobs == 0
    assert chat(logprobs=True, top_logprobs=4).num_logprobs == 4
    assert chat(max_tokens=10, max_completion_tokens=3).requested_max_tokens == 3
    assert chat(max_tokens=10).requested_max_tokens == 10


def test_single_prompt_unwraps_a_batch_of_one() -> None:
    assert CompletionRequest(prompt=["only"]).single_prompt == "only"
    assert CompletionRequest(prompt=[[4, 5]]).single_prompt == [4, 5]
    assert CompletionRequest(prompt=[4, 5]).single_prompt == [4, 5]


def test_pd_flags() -> None:
    assert completion(kv_transfer_params={"do_remote_decode": True}).remote_decode
    assert completion(kv_transfer_params={"do_remote_prefill": True}).remote_prefill
    assert not completion().remote_decode and not completion().remote_prefill


def test_unknown_fields_are_ignored_as_vllm_does() -> None:
    assert completion(some_future_field=1).check("tiny") is None


# --- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loc,param", [
    (("body", "temperature"), "temperature"), (("body", "prompt", "list[int]", 0), "prompt.0"),
    (("body", "messages", 0, "content", "str"), "messages.0.content"), (("body", 17), "body"), (("body",), "body"),
    (("body", "stream_options", "include_usage"), "stream_options.include_usage"),
    (("body", "messages", 1, "content", "list[ContentPart]", 0, "type"), "messages.1.content.0.type"),
    (("body", "kv_transfer_params", "\x00", "[key]"), "kv_transfer_params"),
])
def test_param_from_loc(loc: tuple, param: str) -> None:
    assert param_from_loc(loc) == param


def test_an_error_body_escapes_what_json_cannot_carry() -> None:
    body = error_body("bad \ud800 and \x00", "kv_transfer_params.\x00")
    assert body["error"]["message"] == "bad \\ud800 and \\x00"
    assert body["error"]["param"] == "kv_transfer_params.\\x00"
    assert printable("plain é") == "plain é"
    body["error"]["message"].encode("utf-8")  # would raise on a lone surrogate


# --- logprobs ------------------------------------------------------------------------------------------

WORDS = {1: "Hi", 2: " there", 3: "é"}


def logprobs() -> list[TokenLogprob]:
    return [TokenLogprob(1, -0.1, 1, [(1, -0.1), (2, -2.5)]), TokenLogprob(3, -1.0, 2, [(2, -0.5), (3, -1.0)])]


def test_chat_logprobs_shape() -> None:
    content = LogprobFormatter(WORDS.get).chat(logprobs())["content"]
    assert content[0] == {
        "token": "Hi", "logprob": -0.1, "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105]},
                         {"token": " there", "logprob": -2.5, "bytes": list(b" there")}],
    }
    assert content[1]["bytes"] == list("é".encode())


def test_completion_logprobs_shape_and_offsets_across_chunks() -> None:
    formatter = LogprobFormatter(WORDS.get)
    first = formatter.completion(logprobs()[:1])
    second = formatter.completion(logprobs()[1:])
    assert first == {"tokens": ["Hi"], "token_logprobs": [-0.1], "top_logprobs": [{"Hi": -0.1, " there": -2.5}],
                     "text_offset": [0]}
    assert second["text_offset"] == [2]  # continues after "Hi"
    assert second["top_logprobs"] == [{" there": -0.5, "é": -1.0}]


def test_tokens_as_ids_and_infinite_logprobs() -> None:
    formatter = LogprobFormatter(WORDS.get, as_token_ids=True)
    rendered = formatter.completion([TokenLogprob(2, -math.inf, 9, [])])
    assert rendered["tokens"] == ["token_id:2"]
    assert rendered["token_logprobs"] == [-9999.0]  # JSON has no -inf
