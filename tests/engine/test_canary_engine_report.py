"""The reference engine's canary hooks over HTTP, on real tiny-engine processes: the `fleet` response
extension reports the running batch a request was served at (alone: 1/1; beside three decoding streams: at
least 4), in JSON bodies and in a stream's usage chunk; an unknown planted fault in the environment stops the
engine before it loads, with one line naming the variable and the known faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from engine.contract.faults import FAULT_ENV, FAULTS, RESPONSE_EXTENSION

BODY = {"model": "tiny", "prompt": "The river runs past the stone", "max_tokens": 6, "temperature": 0,
        "ignore_eos": True}
BACKGROUND_TOKENS = 1500  # long enough that the background streams still decode while the probe runs


def batch_sizes(body: dict) -> tuple[int, int]:
    ext = body[RESPONSE_EXTENSION]
    return ext["batch_size_min"], ext["batch_size_max"]


def test_a_request_alone_reports_batch_size_one(tiny_engine) -> None:
    tiny_engine.wait_idle()
    completion = tiny_engine.post("/v1/completions", BODY)
    chat = tiny_engine.post("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4,
        "temperature": 0, "ignore_eos": True})
    assert completion.status_code == chat.status_code == 200
    assert batch_sizes(completion.json()) == (1, 1)
    assert batch_sizes(chat.json()) == (1, 1)


def test_a_stream_reports_batch_sizes_in_its_usage_chunk_only(tiny_engine) -> None:
    tiny_engine.wait_idle()
    with tiny_engine.client() as client, client.stream(
            "POST", "/v1/completions", json={**BODY, "stream": True, "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    assert batch_sizes(usage_chunk) == (1, 1)
    assert all(RESPONSE_EXTENSION not in c for c in chunks[:-1])


async def _first_content(lines: AsyncIterator[str]) -> None:
    """Read a stream up to its first token. The caller keeps `lines` alive: an abandoned line iterator is
    finalised, which closes the response and so aborts the request."""
    while True:
        line = await lines.__anext__()  # StopAsyncIteration: the stream ended before its first token
        if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
            return


async def _probe_beside_decoding_streams(engine, n_background: int) -> dict:
    """Open n streams, wait until each has sent a token (they are decoding), then send one request; its body."""
    async with httpx.AsyncClient(base_url=engine.url, headers=engine.headers, timeout=60) as client:
        background = {**BODY, "max_tokens": BACKGROUND_TOKENS, "stream": True}
        streams = [client.stream("POST", "/v1/completions", json=background) for _ in range(n_background)]
        responses = [await s.__aenter__() for s in streams]
        lines = [r.aiter_lines() for r in responses]
        try:
            await asyncio.gather(*(_first_content(it) for it in lines))
            probe = await client.post("/v1/completions", json=BODY)
            assert probe.status_code == 200, probe.text
            running = engine.metric("vllm:num_requests_running")
            assert running >= n_background, "the background streams stopped decoding"
            return probe.json()
        finally:
            for stream in streams:  # closing a stream aborts its request in the engine
                await stream.__aexit__(None, None, None)


def test_a_request_beside_three_decoding_streams_reports_a_batch_of_at_least_four(tiny_engine) -> None:
    tiny_engine.wait_idle()
    body = asyncio.run(_probe_beside_decoding_streams(tiny_engine, 3))
    smallest, largest = batch_sizes(body)
    assert largest >= 4
    assert 1 <= smallest <= largest
    tiny_engine.wait_idle()


@pytest.mark.parametrize("value", ["kv_fp8", "ROPE"])
def test_an_unknown_planted_fault_exits_with_one_line_naming_the_variable(launch_engine, value: str) -> None:
    engine = launch_engine(env={FAULT_ENV: value}, wait=False)
    assert engine.proc.wait(60) == 2
    lines = [line for line in engine.log_path.read_text().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert FAULT_ENV in lines[0] and repr(value) in lines[0]
    assert all(fault in lines[0] for fault in FAULTS)
