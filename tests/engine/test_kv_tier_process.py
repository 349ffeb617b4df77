"""The node's KV tiers between real reference-engine processes and the agent's tier routes, on loopback (tiny
model). The routes run in this process over a real TierRegistry and disk directory (the agent serves the same
routes over the same registry; starting a whole agent would need a controller and adds nothing here).

A prompt whose blocks were evicted from the engine's small pool comes back from the DRAM tier, and from the disk
tier, token for token as it was computed cold; a restarted tier host rebuilds its disk index and a new engine
warms from it; bad credentials and bodies are refused naming the field."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import uvicorn
import zmq
from fastapi import FastAPI

from agent.api import kv_routes
from agent.kv_tiers.registry import TierRegistry
from agent.ports import free_port
from engine.contract.kv_tier import TIER_TOKEN_ENV
from engine.hashing import block_hashes_int64
from engine.kv_events import decode_batch
from fleetctl.gateway.prefix_index import PrefixHit, PrefixIndex

if TYPE_CHECKING:
    from conftest import EngineProcess

TOKEN = "tier-token-for-tests"
ADMIN = "admin-credential-for-tests"
TIERS = {"dram-class": {"dram_mib": 64}, "disk-class": {"disk_mib": 64}}
TARGET = [(300 + 37 * i) % 40000 + 100 for i in range(150)]  # 9 full blocks a lookup may hit
FILLERS = [[(1000 + 53 * i + 7 * n) % 40000 + 100 for i in range(140)] for n in range(3)]


class TierHost:
    """The tier routes over a registry rooted at `root`, served by uvicorn on a thread."""

    def __init__(self, root: Path):
        self.registry = TierRegistry(root)
        for name, tiers in TIERS.items():
            self.registry.ensure(name, tiers)
        app = FastAPI()
        kv_routes(app, self.registry, "node-t", tier_token=lambda: TOKEN, credential=lambda: ADMIN)
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the tier host did not start"
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def status(self, class_name: str, tier: str) -> dict:
        rows = httpx.get(f"{self.url}/kv/status").json()["tiers"]
        return next(r for r in rows if r["class_name"] == class_name and r["tier"] == tier)


@pytest.fixture(scope="module")
def tier_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiers")


@pytest.fixture(scope="module")
def host(tier_root: Path) -> Iterator[TierHost]:
    tier_host = TierHost(tier_root)
    yield tier_host
    tier_host.stop()


def engine_on(launch_engine, host: TierHost, class_name: str) -> "EngineProcess":
    return launch_engine("--num-blocks-override", "24", "--kv-tier-url", f"{host.url}/kv/tiers/{class_name}",
                         env={TIER_TOKEN_ENV: TOKEN})


def greedy_tokens(engine: "EngineProcess", prompt: list[int]) -> list[int]:
    response = engine.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                               "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True})
    assert response.status_code == 200, response.text
    return [int(t.removeprefix("token_id:")) for t in response.json()["choices"][0]["logprobs"]["tokens"]]


def wait_until(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


@pytest.mark.parametrize("class_name, tier", [("dram-class", "dram"), ("disk-class", "disk")])
def test_a_prompt_evicted_from_the_engine_comes_back_from_the_tier_identical(launch_engine, host, class_name, tier):
    engine = engine_on(launch_engine, host, class_name)
    cold = greedy_tokens(engine, TARGET)
    for filler in FILLERS:  # 3 x 10 blocks through a 24-block pool: the target's blocks are evicted
        greedy_tokens(engine, filler)
    wait_until(lambda: host.status(class_name, tier)["blocks"] >= 9)
    hits_before = host.status(class_name, tier)["hits"]
    assert greedy_tokens(engine, TARGET) == cold
    assert engine.metric("fleet_kv_tier_fetched_blocks_total", tier=tier) >= 9
    assert engine.metric("fleet_kv_tier_fetch_seconds_count", tier=tier) >= 9  # blocks, by the slowest tier read
    assert engine.metric("fleet_kv_tier_fetch_seconds_sum", tier=tier) > 0
    assert engine.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") >= 9 * 16
    assert host.status(class_name, tier)["hits"] >= hits_before + 9
    engine.stop()


def test_a_restarted_tier_host_rebuilds_its_disk_index_and_a_new_engine_warms_from_it(launch_engine, tmp_path):
    host = TierHost(tmp_path)
    first = engine_on(launch_engine, host, "disk-class")
    cold = greedy_tokens(first, TARGET)
    for filler in FILLERS:
        greedy_tokens(first, filler)
    wait_until(lambda: host.status("disk-class", "disk")["blocks"] >= 9)
    first.stop()
    host.stop()
    restarted = TierHost(tmp_path)  # the agent, started again: only the files are left
    try:
        assert restarted.status("disk-class", "disk")["blocks"] >= 9
        fresh = engine_on(launch_engine, restarted, "disk-class")
        assert greedy_tokens(fresh, TARGET) == cold  # its own cache is empty: the prefix comes from disk
        assert fresh.metric("fleet_kv_tier_fetched_blocks_total", tier="disk") >= 9
        fresh.stop()
    finally:
        restarted.stop()


def test_the_engines_event_stream_says_which_blocks_its_nodes_tier_holds(launch_engine, tmp_path, free_port):
    """The engine relays its tier's events on its KV event stream, so a gateway's index sees a tier hit there."""
    host = TierHost(tmp_path)  # its own empty tier: a block the tier already holds is not stored (nor announced) again
    events_endpoint = f"tcp://127.0.0.1:{free_port()}"
    engine = launch_engine("--num-blocks-override", "24", "--kv-tier-url", f"{host.url}/kv/tiers/dram-class",
                           "--kv-events-endpoint", events_endpoint, env={TIER_TOKEN_ENV: TOKEN})
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(events_endpoint)
    index, seq = PrefixIndex(), 0

    def tier_hit() -> PrefixHit:
        nonlocal seq
        while sub.poll(0):
            index.apply_batch("e", seq, decode_batch(sub.recv_multipart()[-1]), allow_gap=True)
            seq += 1
        return index.prefix_hits(block_hashes_int64(TARGET)[:9], ["e"]).get("e", PrefixHit())

    try:
        time.sleep(1.0)  # ZMQ's slow joiner: let the subscription reach the engine before the events we need
        greedy_tokens(engine, TARGET)
        wait_until(lambda: tier_hit().memory_blocks == 9, timeout_s=10)
        for filler in FILLERS:  # the target's blocks leave the engine's pool for the node's DRAM tier
            greedy_tokens(engine, filler)
        wait_until(lambda: tier_hit() == PrefixHit(0, (("CPU", 9),)))
        flushed = httpx.post(f"{host.url}/kv/flush", json={"class": "dram-class", "tier": "dram"},
                             headers={"authorization": f"Bearer {ADMIN}"})
        assert flushed.status_code == 200
        wait_until(lambda: tier_hit().blocks == 0)  # and gone from the index when the tier drops them
    finally:
        sub.close(linger=0)
        context.term()
        engine.stop()
        host.stop()


def test_bad_credentials_and_bodies_are_refused_naming_the_field(tier_root):
    tier_host = TierHost(tier_root / "refusals")
    try:
        url = f"{tier_host.url}/kv/tiers/dram-class"
        assert httpx.post(f"{url}/blocks", content=b"x", headers={"authorization": "Bearer wrong"}).status_code == 401
        auth = {"authorization": f"Bearer {TOKEN}"}
        garbage = httpx.post(f"{url}/blocks", content=b"\x00\x00\x00\x05hello", headers=auth)
        assert garbage.status_code == 400 and garbage.json()["error"]["field"] == "body"
        bad = httpx.post(f"{url}/fetch", json={"layout": "NOT-HEX", "hashes": [], "tokens": []}, headers=auth)
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "layout"
        uneven = httpx.post(f"{url}/fetch", json={"layout": "ab" * 16, "hashes": [1, 2], "tokens": [[1]]}, headers=auth)
        assert uneven.status_code == 422 and uneven.json()["error"]["field"] == "tokens"
        unknown = httpx.post(f"{tier_host.url}/kv/tiers/nope/fetch", json={}, headers=auth)
        assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "class"
        flush = httpx.post(f"{tier_host.url}/kv/flush", json={"tier": "tape"}, headers={"authorization": f"Bearer {ADMIN}"})
        assert flush.status_code == 422 and flush.json()["error"]["field"] == "tier"
        assert httpx.post(f"{tier_host.url}/kv/flush", json={}, headers=auth).status_code == 401  # not the admin's
    finally:
        tier_host.stop()
