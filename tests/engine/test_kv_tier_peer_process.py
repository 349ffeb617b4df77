"""Cross-node KV fetch between real reference-engine processes (tiny model) on loopback: two "nodes", each its
own tier host (the agent's tier routes over a TierRegistry, as in test_kv_tier_process.py), one engine on each.
An engine told to fetch from its peer loads the blocks the peer's node tier holds and answers token for token
as cold; a peer whose transfer is corrupt, too slow or refused costs a recompute, never a wrong answer.

The faulty peers are fault injectors in this process, standing in front of the real peer engine."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response

from agent.ports import free_port
from engine.contract.kv_tier import MEDIA_HEADER, TIER_TOKEN_ENV
from tests.engine.test_kv_tier_process import TOKEN, TierHost, greedy_tokens, wait_until

if TYPE_CHECKING:
    from conftest import EngineProcess

API_KEY = "engine-key-for-tests"
PROMPTS = [[(500 + 41 * i + 11 * n) % 40000 + 100 for i in range(150)] for n in range(5)]  # 9 full blocks each
FILLERS = [[(3000 + 29 * i + 13 * n) % 40000 + 100 for i in range(140)] for n in range(3)]
TIMEOUT_S = 1.0


class FaultyPeer:
    """POST /kv/tier/fetch in front of a real peer engine: `corrupt` flips the frame's last byte (a payload byte,
    so its block fails the CRC), `slow` answers after the asker's timeout."""

    def __init__(self, upstream: str, fault: str):
        app = FastAPI()

        @app.post("/kv/tier/fetch")
        async def fetch(request: Request) -> Response:
            async with httpx.AsyncClient() as client:
                answer = await client.post(f"{upstream}/kv/tier/fetch", content=await request.body(),
                                           headers={"authorization": request.headers.get("authorization", ""),
                                                    "content-type": "application/json"})
            frame = answer.content
            if fault == "corrupt":
                frame = frame[:-1] + bytes([frame[-1] ^ 0xFF])
            elif fault == "slow":
                await asyncio.sleep(TIMEOUT_S * 3)
            return Response(frame, status_code=answer.status_code,
                            headers={MEDIA_HEADER: answer.headers.get(MEDIA_HEADER, "")})

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the faulty peer did not start"
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, launch_engine) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    hosts = [TierHost(tmp_path_factory.mktemp(f"node-{name}")) for name in ("a", "b")]
    engines = [launch_engine("--num-blocks-override", "24", "--kv-tier-url", f"{host.url}/kv/tiers/dram-class",
                             "--kv-tier-timeout-s", str(TIMEOUT_S), env={TIER_TOKEN_ENV: TOKEN}, api_key=API_KEY)
               for host in hosts]
    yield engines[0], engines[1]
    for engine in engines:
        engine.stop()
    for host in hosts:
        host.stop()


def asked_from(engine: EngineProcess, prompt: list[int], peer: str | None, node: str = "node-a") -> list[int]:
    params = {} if peer is None else {"kv_transfer_params": {"tier_peer": peer, "tier_peer_node": node}}
    response = engine.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                               "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True,
                                               **params})
    assert response.status_code == 200, response.text
    return [int(t.removeprefix("token_id:")) for t in response.json()["choices"][0]["logprobs"]["tokens"]]


@pytest.fixture(scope="module")
def warm_peer(nodes) -> dict[int, list[int]]:
    """Engine a computes every prompt (their cold answers), then evicts them into node a's DRAM tier."""
    peer, _ = nodes
    cold = {n: greedy_tokens(peer, prompt) for n, prompt in enumerate(PROMPTS)}
    for filler in FILLERS * 2:
        greedy_tokens(peer, filler)
    wait_until(lambda: peer.metric("fleet_kv_tier_offloaded_blocks_total") >= 9 * len(PROMPTS))
    return cold


def peer_metric(engine: EngineProcess, name: str) -> float:
    return engine.metric(name, source="node-a")


def test_an_engine_told_to_fetch_from_its_peer_loads_the_peers_node_tier_blocks(nodes, warm_peer):
    peer, asker = nodes
    assert asked_from(asker, PROMPTS[0], peer.url) == warm_peer[0]
    assert peer_metric(asker, "fleet_kv_tier_peer_fetched_blocks_total") >= 9
    assert peer_metric(asker, "fleet_kv_tier_peer_fetch_seconds_count") >= 9
    assert asker.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") >= 9 * 16


@pytest.mark.parametrize("fault", ["corrupt", "slow"])
def test_a_bad_or_slow_transfer_falls_back_to_recompute_with_the_right_answer(nodes, warm_peer, fault):
    peer, asker = nodes
    prompt_index = 1 if fault == "corrupt" else 2
    faulty = FaultyPeer(peer.url, fault)
    try:
        fetched = peer_metric(asker, "fleet_kv_tier_peer_fetched_blocks_total")
        failures = peer_metric(asker, "fleet_kv_tier_peer_fetch_failures_total")
        assert asked_from(asker, PROMPTS[prompt_index], faulty.url) == warm_peer[prompt_index]
        assert peer_metric(asker, "fleet_kv_tier_peer_fetch_failures_total") == failures + 1
        assert peer_metric(asker, "fleet_kv_tier_peer_fetched_blocks_total") == fetched
    finally:
        faulty.stop()


def test_a_refused_peer_falls_back_and_a_malformed_one_is_refused_naming_the_field(nodes, warm_peer):
    _, asker = nodes
    assert asked_from(asker, PROMPTS[3], f"http://127.0.0.1:{free_port()}") == warm_peer[3]
    response = asker.post("/v1/completions", {"prompt": PROMPTS[4], "max_tokens": 2,
                                              "kv_transfer_params": {"tier_peer": "file:///etc/passwd",
                                                                     "tier_peer_node": "node-a"}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "kv_transfer_params.tier_peer"
