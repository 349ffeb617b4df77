"""The engine core with a KV tier (tiny model, in process): evicted blocks reach the tier without the decode
loop ever waiting for it, and a prompt restored from the tier decodes token for token as a cold one does."""

from __future__ import annotations

import threading

import pytest
import torch

from agent.kv_tiers.store import TierStore
from engine.contract.kv_tier import TierBlock
from engine.hashing import to_int64
from engine.reference.config import EngineConfig
from engine.reference.kv_tier_client import TierFetcher, TierOffloader, block_payload, engine_layout, payload_tensor
from engine.reference.llm_engine import LLMEngine
from tests.engine.test_llm_engine import greedy, prompts, run, tokens

BLOCK = 16


def make_engine(num_blocks: int = 24, **overrides) -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", num_blocks_override=num_blocks, block_size=BLOCK, **overrides))


class StoreSink:
    """The tier sink an engine offloads to, writing straight into a store (no HTTP: the core is under test)."""

    def __init__(self, store: TierStore, layout: str):
        self.store, self.layout, self.skipped_blocks = store, layout, 0

    def room(self) -> int:
        return 1_000

    def offer(self, blocks, kv: torch.Tensor) -> None:
        self.store.offload([TierBlock.make(self.layout, to_int64(b.block_hash), b.token_ids, block_payload(kv, i))
                            for i, b in enumerate(blocks)])

    def skipped(self, count: int) -> None:
        self.skipped_blocks += count


def fetcher(engine: LLMEngine) -> TierFetcher:
    runner = engine.runner
    return TierFetcher("http://unused", layout(engine), token=None, block_size=BLOCK, hash_seed=engine.config.hash_seed,
                       kv_dtype=runner.kv_dtype, block_shape=runner.kv_block_shape(),
                       cached_prefix_blocks=engine.block_manager.cached_prefix_blocks, client=lambda: None)


def layout(engine: LLMEngine) -> str:
    return engine_layout(engine.config, engine.runner.kv_block_shape(), engine.runner.kv_dtype)


def restore_args(engine: LLMEngine, store: TierStore, prompt: list[int]) -> dict:
    """What the server's tier fetch would hand the engine for `prompt` (TierFetcher.acquire, minus HTTP)."""
    fetch = fetcher(engine)
    hashes, block_tokens = fetch.prompt_blocks(prompt)
    own = engine.block_manager.cached_prefix_blocks(hashes)
    found = store.fetch(fetch.layout, [to_int64(h) for h in hashes[own:]], block_tokens[own:])
    assert found.blocks, "the tier held none of the prompt's blocks"
    return {"external_kv": fetch._tensor(found.blocks), "external_kv_tokens": (own + len(found.blocks)) * BLOCK,
            "external_kv_first_block": own}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_block_bytes_round_trip_bit_exact_for_every_kv_dtype(dtype):
    kv = torch.randn(2, 2, 3, BLOCK, 1, 8).to(dtype)
    for index in range(3):
        back = payload_tensor(block_payload(kv, index), dtype, (2, 2, BLOCK, 1, 8))
        assert back.dtype == dtype and torch.equal(back.view(torch.uint8), kv[:, :, index].contiguous().view(torch.uint8))


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16"])
def test_a_prompt_restored_from_the_tier_decodes_like_a_cold_one(kv_cache_dtype):
    target, *fillers = prompts(4, seed=3, lengths=(150, 140, 140, 140))
    cold = tokens(run(make_engine(kv_cache_dtype=kv_cache_dtype), {"t": (target, greedy())}))["t"]
    engine = make_engine(kv_cache_dtype=kv_cache_dtype)
    store = TierStore(dram_bytes=64 << 20)
    engine.set_tier_sink(StoreSink(store, layout(engine)))
    run(engine, {"t": (target, greedy())})
    run(engine, {f"f{i}": (p, greedy()) for i, p in enumerate(fillers)})  # evicts the target's blocks
    assert engine.block_manager.cached_prefix_blocks(fetcher(engine).prompt_blocks(target)[0]) == 0
    args = restore_args(engine, store, target)
    assert args["external_kv_first_block"] == 0 and args["external_kv_tokens"] == 9 * BLOCK
    warm = run(engine, {"t2": (target, greedy())}, t2=args)["t2"]
    assert warm["tokens"] == cold


def test_a_tier_run_that_follows_the_engines_own_blocks_is_loaded_after_them():
    target, filler = prompts(2, seed=5, lengths=(150, 120))
    cold = tokens(run(make_engine(), {"t": (target, greedy())}))["t"]
    engine = make_engine(num_blocks=14)  # 11 blocks of the target, then 9 of the filler
    store = TierStore(dram_bytes=64 << 20)
    engine.set_tier_sink(StoreSink(store, layout(engine)))
    run(engine, {"t": (target, greedy())})
    run(engine, {"f": (filler, greedy())})  # frees tail first: the target's last blocks go, its first stay
    own = engine.block_manager.cached_prefix_blocks(fetcher(engine).prompt_blocks(target)[0])
    assert 0 < own < 9
    args = restore_args(engine, store, target)
    assert args["external_kv_first_block"] == own
    steps: list = []
    warm = run(engine, {"t2": (target, greedy())}, steps, t2=args)["t2"]
    assert warm["tokens"] == cold and warm["cached"] == own * BLOCK
    assert sum(step.iteration.prompt_tokens_external for step in steps) == (9 - own) * BLOCK


def test_tier_blocks_after_a_gap_are_not_used_and_the_prompt_is_computed():
    target = prompts(1, seed=7, lengths=(150,))[0]
    cold = tokens(run(make_engine(), {"t": (target, greedy())}))["t"]
    engine = make_engine()
    bogus = torch.full((*engine.runner.kv_block_shape()[:2], 3, *engine.runner.kv_block_shape()[2:]), 7.0,
                       dtype=engine.runner.kv_dtype)
    # blocks said to follow 4 blocks of the engine's own that it does not hold: there would be a gap
    args = {"external_kv": bogus, "external_kv_tokens": 7 * BLOCK, "external_kv_first_block": 4}
    result = run(engine, {"t": (target, greedy())}, t=args)["t"]
    assert result["tokens"] == cold and result["cached"] == 0


def test_a_stalled_tier_never_holds_up_decode():
    released = threading.Event()
    sent: list[bytes] = []

    def stalled_post(frame: bytes) -> int:
        released.wait(30)  # the agent does not answer until the test is done
        sent.append(frame)
        return 200

    engine = make_engine(num_blocks=20)
    offloader = TierOffloader("http://unused", layout(engine), token=None, max_queued_blocks=4, post=stalled_post)
    engine.set_tier_sink(offloader)
    try:
        results = run(engine, {f"r{i}": (p, greedy()) for i, p in enumerate(prompts(6, seed=9, lengths=(150, 120)))})
        assert all(len(r["tokens"]) == 12 for r in results.values())  # every request decoded to the end
        assert offloader.counters.dropped_full > 0  # the queue filled; the rest was skipped, not waited for
        assert offloader.room() == 0
    finally:
        released.set()
        assert offloader.flush(30)
        offloader.close()
    assert offloader.counters.offloaded == 4 and len(sent) >= 1
