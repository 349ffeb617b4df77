"""Client requests: validation names the bad field; the prompt is tokenised as the engine does; P/D bodies."""

from __future__ import annotations

import json

import pytest

from fleetctl.gateway.errors import BadRequest
from fleetctl.gateway.pd import decode_body, prefill_body
from fleetctl.gateway.requests import CHAT, COMPLETION, parse_request, prompt_token_ids, resolve_model
from fleetctl.gateway.upstream import EngineRejected, UpstreamFailure, check_status


def parse(kind: str, body: object):
    return parse_request(kind, json.dumps(body).encode())


@pytest.mark.parametrize(("kind", "body", "param"), [
    (COMPLETION, {"model": "m", "prompt": "x", "temperature": "hot"}, "temperature"),
    (COMPLETION, {"model": "m", "prompt": []}, "prompt"),
    (COMPLETION, {"model": "m", "prompt": ["a", "b"]}, "prompt"),
    (COMPLETION, {"model": "m", "prompt": "x", "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
    (CHAT, {"model": "m", "messages": []}, "messages"),
    (CHAT, {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    (CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {}}, "stream_options"),
])
def test_invalid_requests_name_the_field(kind: str, body: dict, param: str) -> None:
    with pytest.raises(BadRequest) as excinfo:
        parse(kind, body)
    assert excinfo.value.param == param and excinfo.value.status_code == 400


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff"])
def test_bodies_that_are_not_json_objects(raw: bytes) -> None:
    with pytest.raises(BadRequest) as excinfo:
        parse_request(COMPLETION, raw)
    assert excinfo.value.param == "body"


def test_a_clients_kv_transfer_params_never_reach_an_engine() -> None:
    # the gateway's word to its engines (where to pull K/V from, which peer to fetch blocks from): a client that
    # set it could point an engine, holding the fleet's engine key, at a host of its choosing
    body = {"model": "m", "prompt": "hi", "kv_transfer_params": {"tier_peer": "http://evil", "do_remote_prefill": True}}
    assert "kv_transfer_params" not in parse_request(COMPLETION, json.dumps(body).encode()).body


def test_unknown_fields_are_kept_for_the_engine() -> None:
    request = parse(COMPLETION, {"model": "m", "prompt": "x", "vllm_xargs": {"a": 1}, "priority": 3})
    assert request.body["vllm_xargs"] == {"a": 1} and request.path == "/v1/completions"


def test_the_model_defaults_to_the_only_one() -> None:
    request = parse(COMPLETION, {"prompt": "x"})
    assert resolve_model(request, {"tiny": object()}) == "tiny"
    with pytest.raises(BadRequest, match="model is required"):
        resolve_model(request, {"a": object(), "b": object()})


class FakeTokenizer:
    async def chat(self, messages, add_generation_prompt):
        return [len(messages), int(add_generation_prompt)]

    async def text(self, prompt):
        return [ord(c) for c in prompt]


async def test_prompts_of_every_form_become_token_ids() -> None:
    tok = FakeTokenizer()
    assert await prompt_token_ids(parse(COMPLETION, {"prompt": "ab"}), tok) == [97, 98]
    assert await prompt_token_ids(parse(COMPLETION, {"prompt": [5, 6]}), tok) == [5, 6]
    assert await prompt_token_ids(parse(COMPLETION, {"prompt": [[7, 8]]}), tok) == [7, 8]
    assert await prompt_token_ids(parse(COMPLETION, {"prompt": ["c"]}), tok) == [99]
    chat = parse(CHAT, {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False})
    assert await prompt_token_ids(chat, tok) == [1, 0]


def test_pd_bodies_follow_vllms_proxy_protocol() -> None:
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True},
            "max_completion_tokens": 50, "min_tokens": 5, "temperature": 0}
    prefill = prefill_body(body, "http://decode:8200")
    assert prefill["stream"] is False and "stream_options" not in prefill
    assert prefill["max_tokens"] == 1 and prefill["max_completion_tokens"] == 1 and prefill["min_tokens"] == 0
    assert prefill["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                             "remote_block_ids": None, "remote_host": None, "remote_port": None,
                                             "push_to": "http://decode:8200"}
    assert "push_to" not in prefill_body(body, None)["kv_transfer_params"]
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2]}
    decode = decode_body(body, params)
    assert decode["kv_transfer_params"] == params and decode["stream"] is True and decode["max_completion_tokens"] == 50
    assert "kv_transfer_params" not in body  # the client's body is not changed


@pytest.mark.parametrize(("status", "reason", "hard"), [(429, "overloaded", False), (503, "unavailable", True),
                                                        (500, "error_5xx", False), (502, "error_5xx", False)])
def test_engine_statuses_that_another_engine_may_serve(status: int, reason: str, hard: bool) -> None:
    import httpx

    with pytest.raises(UpstreamFailure) as excinfo:
        check_status(status, b'{"error": {"message": "busy"}}', httpx.Headers({"retry-after": "3"}), "http://e")
    assert (excinfo.value.reason, excinfo.value.hard, excinfo.value.retry_after) == (reason, hard, "3")
    assert "busy" in excinfo.value.message


def test_a_client_error_from_the_engine_is_passed_on() -> None:
    import httpx

    with pytest.raises(EngineRejected) as excinfo:
        check_status(400, b'{"error": {"message": "n=2"}}', httpx.Headers({"content-type": "application/json"}), "http://e")
    assert excinfo.value.status == 400 and excinfo.value.body == b'{"error": {"message": "n=2"}}'
