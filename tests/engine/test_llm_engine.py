"""The engine core end to end on the tiny model: the same greedy request gives the same tokens however
it is scheduled (chunked or whole, cold or prefix-cached, preempted or not, mixed or through P/D)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.errors import ContextLengthExceeded, InvalidRequest
from engine.reference.config import EngineConfig
from engine.reference.llm_engine import LLMEngine
from engine.contract.sampling_params import SamplingParams


def make_engine(**overrides) -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", kv_cache_mib=overrides.pop("kv_cache_mib", 8), **overrides))


def prompts(n: int, seed: int = 0, lengths=(37, 16, 80, 5, 130)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def greedy(max_tokens: int = 12, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]], steps: list | None = None,
        **add_kw) -> dict:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params, **add_kw.get(rid, {}))
    results = {rid: {"tokens": [], "text": "", "finish": None, "stop": None, "cached": 0} for rid in requests}
    while engine.has_work():
        step = engine.step()
        if steps is not None:
            steps.append(step)
        for out in step.outputs:
            r = results[out.request_id]
            r["tokens"] += out.new_token_ids
            r["text"] += out.new_text
            r["cached"] = out.num_cached_tokens
            if out.finished:
                r["finish"], r["stop"] = out.finish_reason, out.stop_reason
    return results


def tokens(results: dict) -> dict[str, list[int]]:
    return {rid: r["tokens"] for rid, r in results.items()}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """Each prompt alone on a roomy engine: the tokens every other schedule must reproduce."""
    engine = make_engine()
    return {
        f"p{i}": run(engine, {f"p{i}": (p, greedy())})[f"p{i}"]["tokens"]
        for i, p in enumerate(prompts(5))
    }


def test_batched_and_chunked_schedules_match_one_at_a_time(reference):
    for budget, chunked in ((16, True), (64, True), (512, False)):
        engine = make_engine(max_num_batched_tokens=budget, enable_chunked_prefill=chunked)
        got = run(engine, {f"p{i}": (p, greedy()) for i, p in enumerate(prompts(5))})
        assert tokens(got) == reference, f"budget={budget} chunked={chunked}"
        assert engine.block_manager.usage == 0.0


def test_prefix_cache_hit_gives_same_tokens_and_reports_cached(reference):
    engine = make_engine()
    prompt = prompts(5)[4]  # 130 tokens: 8 full blocks
    first = run(engine, {"a": (prompt, greedy())})["a"]
    second = run(engine, {"b": (prompt, greedy())})["b"]
    assert first["tokens"] == second["tokens"] == reference["p4"]
    assert first["cached"] == 0
    assert second["cached"] == 128  # every full block of the prompt


def test_preemption_recomputes_and_gives_same_tokens(reference):
    # 12 blocks: the longest request alone needs 10, all five together need 25, so requests get preempted.
    engine = make_engine(num_blocks_override=12, max_num_batched_tokens=64)
    steps = []
    got = run(engine, {f"p{i}": (p, greedy()) for i, p in enumerate(prompts(5))}, steps=steps)
    assert sum(step.iteration.num_preemptions for step in steps) > 0
    assert tokens(got) == reference
    assert engine.block_manager.usage == 0.0


def test_stop_string_stop_token_and_length():
    engine = make_engine()
    prompt = prompts(1)[0]
    free = run(engine, {"x": (prompt, greedy(20))})["x"]
    assert free["finish"] == "length" and len(free["tokens"]) == 20
    stop_token = free["tokens"][5]
    by_token = run(engine, {"t": (prompt, greedy(20, stop_token_ids=[stop_token]))})["t"]
    first = free["tokens"].index(stop_token)
    assert by_token["finish"] == "stop" and by_token["stop"] == stop_token
    assert by_token["tokens"] == free["tokens"][: first + 1]
    word = free["text"].split()[2]
    by_string = run(engine, {"s": (prompt, greedy(20, stop=[word]))})["s"]
    assert by_string["finish"] == "stop" and by_string["stop"] == word
    assert word not in by_string["text"] and free["text"].startswith(by_string["text"])


def test_abort_frees_blocks():
    engine = make_engine()
    engine.add_request("a", prompts(1)[0], greedy(50))
    engine.step()
    assert engine.block_manager.usage > 0
    out = engine.abort("a")
    assert out.finished and out.finish_reason == "abort"
    assert engine.block_manager.usage == 0.0 and not engine.has_work()


def test_invalid_requests_name_the_field():
    engine = make_engine(max_model_len=64)
    with pytest.raises(ContextLengthExceeded) as err:
        engine.add_request("long", list(range(100, 200)), greedy())
    assert err.value.param == "prompt"
    with pytest.raises(ContextLengthExceeded) as err:
        engine.add_request("room", list(range(100, 150)), greedy(max_tokens=30))
    assert err.value.param == "max_tokens"
    with pytest.raises(InvalidRequest) as err:
        engine.add_request("empty", [], greedy())
    assert err.value.param == "prompt"
    assert not engine.has_work()


class ListSink:
    def __init__(self):
        self.blocks: dict[int, torch.Tensor] = {}
        self.num_tokens = None

    def push(self, index, kv):
        self.blocks[index] = kv

    def done(self, num_tokens):
        self.num_tokens = num_tokens

    def stacked(self) -> torch.Tensor:
        return torch.cat([self.blocks[i] for i in sorted(self.blocks)], dim=2)


def test_pd_pull_matches_mixed(reference):
    prefill, decode = make_engine(role="prefill"), make_engine(role="decode")
    for i, prompt in enumerate(prompts(5)):
        rid = f"p{i}"
        first = run(prefill, {rid: (prompt, greedy(1))}, **{rid: {"hold_blocks": True}})
        assert first[rid]["tokens"] == reference[rid][:1]
        block_ids = prefill._held[rid].seq.block_table[: -(-len(prompt) // 16)]
        kv = prefill.export_kv(block_ids)
        assert prefill.release_held(rid)
        got = run(decode, {rid: (prompt, greedy())}, **{rid: {"external_kv": kv, "external_kv_tokens": len(prompt)}})
        assert got[rid]["tokens"] == reference[rid], rid
    assert prefill.block_manager.usage == 0.0 and decode.block_manager.usage == 0.0


def test_pd_push_sends_every_prompt_block_and_matches_mixed(reference):
    prefill, decode = make_engine(role="prefill", max_num_batched_tokens=32), make_engine(role="decode")
    prompt = prompts(5)[4]  # 130 tokens, chunked into 5 steps: blocks are pushed as they fill
    sink = ListSink()
    run(prefill, {"p4": (prompt, greedy(1))}, p4={"kv_push": sink})
    assert sorted(sink.blocks) == list(range(-(-len(prompt) // 16)))
    assert sink.num_tokens == len(prompt)
    got = run(decode, {"p4": (prompt, greedy())}, p4={"external_kv": sink.stacked(), "external_kv_tokens": len(prompt)})
    assert got["p4"]["tokens"] == reference["p4"]


def test_held_blocks_expire_when_nobody_pulls():
    engine = make_engine(kv_transfer_timeout_s=0.0)
    run(engine, {"h": (prompts(1)[0], greedy(1))}, h={"hold_blocks": True})
    assert engine.block_manager.usage > 0  # held for the decode engine
    assert engine.release_expired() == 1
    assert engine.block_manager.usage == 0.0
