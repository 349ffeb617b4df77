"""The routing benchmark's workload shapes: deterministic, in the Mooncake schema, each the shape it claims,
and their reuse ceilings computed by a tested function."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.workloads import SHAPES, TRACE_BLOCK_TOKENS, reuse_ceiling, shapes


def test_every_shape_is_deterministic_by_seed_and_in_the_mooncake_schema():
    for name, generate in shapes().items():
        rows = generate(seed=7)
        assert rows == generate(seed=7), name
        assert rows != generate(seed=8), name
        assert all(set(r) == {"timestamp", "input_length", "output_length", "hash_ids"} for r in rows), name
        assert all(r["input_length"] == len(r["hash_ids"]) * TRACE_BLOCK_TOKENS for r in rows), name
        assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows), name
    assert tuple(shapes()) == SHAPES


def test_the_ceiling_counts_leading_blocks_an_earlier_prompt_had():
    assert reuse_ceiling([]) == 0.0
    rows = [{"timestamp": 0, "hash_ids": [1, 2, 3]}, {"timestamp": 1, "hash_ids": [1, 2, 4]},
            {"timestamp": 2, "hash_ids": [5]}]
    assert reuse_ceiling(rows) == 2 / 7
    assert reuse_ceiling([{"timestamp": 0, "hash_ids": [1, 2]}, {"timestamp": 1, "hash_ids": [2, 1]}]) == 0.0
    assert reuse_ceiling([{"timestamp": 1, "hash_ids": [1, 2]}, {"timestamp": 0, "hash_ids": [1]}]) == 1 / 3  # by time


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), max_size=8))
def test_the_ceiling_matches_a_plain_model(prompts):
    rows = [{"timestamp": i, "hash_ids": p} for i, p in enumerate(prompts)]
    hit = 0
    for i, prompt in enumerate(prompts):
        hit += max([k for k in range(len(prompt) + 1) if any(q[:k] == prompt[:k] for q in prompts[:i] if len(q) >= k)]
                   or [0]) if i else 0
    total = sum(len(p) for p in prompts)
    assert reuse_ceiling(rows) == (hit / total if total else 0.0)


def test_agent_turns_extend_their_sessions_history():
    rows = shapes()["agent"](seed=1)
    prompts = [tuple(r["hash_ids"]) for r in rows]
    extended = sum(1 for i, p in enumerate(prompts) if any(len(q) < len(p) and p[: len(q)] == q for q in prompts[:i]))
    starts = sum(1 for p in prompts if not any(len(q) < len(p) and p[: len(q)] == q for q in prompts))
    assert extended + starts == len(prompts) and extended > starts
    assert reuse_ceiling(rows) > 0.6


def test_rag_documents_come_in_varying_order_which_costs_reuse():
    rows = shapes()["rag"](seed=1)
    doc_sets = [tuple(r["hash_ids"][1:-1]) for r in rows]
    assert len({frozenset(d) for d in doc_sets}) < len(set(doc_sets))  # same documents, another order
    canonical = [{**r, "hash_ids": r["hash_ids"][:1] + sorted(r["hash_ids"][1:-1]) + r["hash_ids"][-1:]} for r in rows]
    assert 0.0 < reuse_ceiling(rows) < reuse_ceiling(canonical)


def test_system_prompts_are_shared_and_no_sharing_shares_nothing():
    rows = shapes()["system_prompt"](seed=1)
    assert len({tuple(r["hash_ids"][:16]) for r in rows}) == 3
    assert 0.8 < reuse_ceiling(rows) < 1.0
    assert reuse_ceiling(shapes()["no_sharing"](seed=1)) == 0.0
