"""Scheduler on tiny pools: batch order, chunked prefill, preemption, P/D loads, prefix hits, and a
hypothesis property test that simulates the engine and checks the block accounting after every operation."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ContextLengthExceeded
from engine.reference.block_manager import BlockManager
from engine.reference.config import EngineConfig
from engine.contract.sampling_params import SamplingParams
from engine.reference.scheduler import Scheduler
from engine.reference.scheduler_output import ScheduledKVLoad, SchedulerOutput
from engine.reference.sequence import Sequence, SequenceStatus

BLOCK_SIZE = 4


def make_scheduler(
    num_blocks: int = 16,
    budget: int = 16,
    max_num_seqs: int = 8,
    chunked: bool = True,
    prefix_caching: bool = True,
) -> Scheduler:
    config = EngineConfig(
        block_size=BLOCK_SIZE,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=prefix_caching,
        max_model_len=256,
    )
    return Scheduler(config, BlockManager(num_blocks, BLOCK_SIZE, prefix_caching, config.hash_seed))


def make_seq(request_id: str, prompt_len: int, max_tokens: int = 4, first_token: int = 0) -> Sequence:
    prompt = list(range(first_token, first_token + prompt_len))
    return Sequence(request_id=request_id, prompt_token_ids=prompt, params=SamplingParams(max_tokens=max_tokens))


def step(sched: Scheduler) -> SchedulerOutput:
    """What the engine does around a forward: sample a token for each sampled chunk, finish at max_tokens."""
    output = sched.schedule()
    for seq in sched.update_after_step(output):
        seq.append_token(1000 + seq.num_output_tokens)
        if seq.num_output_tokens >= seq.params.max_tokens:
            sched.finish(seq, SequenceStatus.FINISHED_LENGTH_CAPPED)
    return output


def chunk_shape(output: SchedulerOutput) -> list[tuple[str, int]]:
    return [(chunk.seq.request_id, chunk.num_new_tokens) for chunk in output.chunks]


def run_to_completion(sched: Scheduler, max_steps: int = 200) -> int:
    for num_steps in range(1, max_steps + 1):
        assert not step(sched).is_empty
        if not sched.has_unfinished():
            return num_steps
    raise AssertionError("did not finish")


def test_a_request_prefills_then_decodes_then_finishes() -> None:
    sched = make_scheduler()
    seq = make_seq("a", 6, max_tokens=3)
    sched.add(seq)
    assert sched.num_waiting == 1
    out = step(sched)
    assert chunk_shape(out) == [("a", 6)]
    assert out.num_batched_tokens == 6
    assert seq.first_scheduled_time is not None
    assert seq.block_table == [0, 1]
    assert chunk_shape(step(sched)) == [("a", 1)]
    assert chunk_shape(step(sched)) == [("a", 1)]
    assert seq.status is SequenceStatus.FINISHED_LENGTH_CAPPED
    assert seq.output_token_ids == [1000, 1001, 1002]
    assert not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == 16


def test_decodes_come_before_prefills() -> None:
    sched = make_scheduler()
    sched.add(make_seq("a", 6))
    step(sched)
    sched.add(make_seq("b", 5, first_token=100))
    out = step(sched)
    assert chunk_shape(out) == [("a", 1), ("b", 5)]
    assert out.num_batched_tokens == 6


def test_a_running_partial_prefill_is_listed_after_decodes() -> None:
    sched = make_scheduler(budget=8)
    sched.add(make_seq("long", 20))
    sched.add(make_seq("short", 3, first_token=100))
    assert chunk_shape(step(sched)) == [("long", 8)]
    sched.finish(sched.get("long"), SequenceStatus.FINISHED_ABORTED)
    sched.add(make_seq("long2", 20, first_token=200))
    assert chunk_shape(step(sched)) == [("short", 3), ("long2", 5)]
    assert chunk_shape(step(sched)) == [("short", 1), ("long2", 7)]


def test_chunked_prefill_splits_a_long_prompt_within_the_budget() -> None:
    sched = make_scheduler(budget=8)
    seq = make_seq("a", 20)
    sched.add(seq)
    chunks = []
    for _ in range(3):
        out = sched.schedule()
        to_sample = sched.update_after_step(out)
        (chunk,) = out.chunks
        chunks.append((chunk.start, chunk.num_new_tokens, chunk.samples, to_sample == [seq]))
        for sampled in to_sample:
            sampled.append_token(7)
    assert chunks == [(0, 8, False, False), (8, 8, False, False), (16, 4, True, True)]
    assert seq.num_output_tokens == 1


def test_chunked_prefill_shares_the_budget_with_decodes() -> None:
    sched = make_scheduler(budget=8)
    sched.add(make_seq("a", 4))
    step(sched)
    sched.add(make_seq("b", 20, first_token=100))
    assert chunk_shape(step(sched)) == [("a", 1), ("b", 7)]


def test_chunking_off_schedules_a_long_prompt_whole() -> None:
    sched = make_scheduler(budget=8, chunked=False)
    sched.add(make_seq("a", 20))
    sched.add(make_seq("b", 3, first_token=100))
    out = step(sched)
    assert chunk_shape(out) == [("a", 20)]  # over budget, but the only prefill of the step
    assert out.num_batched_tokens == 20
    assert chunk_shape(step(sched)) == [("a", 1), ("b", 3)]


def test_chunking_off_runs_a_second_prompt_only_if_it_fits() -> None:
    sched = make_scheduler(budget=8, chunked=False)
    sched.add(make_seq("a", 5))
    sched.add(make_seq("b", 4, first_token=100))
    assert chunk_shape(step(sched)) == [("a", 5)]  # b needs 4 > 3 left: it waits, FCFS
    assert chunk_shape(step(sched)) == [("a", 1), ("b", 4)]


def test_max_num_seqs_is_honoured() -> None:
    sched = make_scheduler(max_num_seqs=2)
    for name in "abc":
        sched.add(make_seq(name, 3, first_token=ord(name) * 10))
    assert chunk_shape(step(sched)) == [("a", 3), ("b", 3)]
    assert (sched.num_running, sched.num_waiting) == (2, 1)
    assert chunk_shape(step(sched)) == [("a", 1), ("b", 1)]


def test_the_newest_is_preempted_when_blocks_run_out_and_resumes_later() -> None:
    sched = make_scheduler(num_blocks=4)
    old, new = make_seq("old", 8, max_tokens=6), make_seq("new", 7, max_tokens=6, first_token=100)
    sched.add(old)
    sched.add(new)
    assert chunk_shape(step(sched)) == [("old", 8), ("new", 7)]  # 2 + 2 blocks: the pool is full
    out = step(sched)  # old needs a third block for position 8: new goes
    assert chunk_shape(out) == [("old", 1)]
    assert out.preempted == [new]
    assert new.status is SequenceStatus.WAITING
    assert (new.num_computed_tokens, new.block_table, new.num_preemptions) == (0, [], 1)
    assert list(sched.waiting) == [new]
    assert sched.take_step_stats().num_preemptions == 1
    run_to_completion(sched)
    assert old.status is new.status is SequenceStatus.FINISHED_LENGTH_CAPPED
    assert new.num_output_tokens == 6
    assert sched.block_manager.num_free_blocks == 4


def test_the_sequence_being_scheduled_preempts_itself_if_it_is_the_newest() -> None:
    sched = make_scheduler(num_blocks=4)
    a, b = make_seq("a", 7, max_tokens=6), make_seq("b", 8, max_tokens=6, first_token=100)
    sched.add(a)
    sched.add(b)
    step(sched)
    out = step(sched)  # a fits position 7 in its block; b needs a third block and is the newest
    assert chunk_shape(out) == [("a", 1)]
    assert out.preempted == [b]
    assert sched.num_running == 1


def test_a_preempted_sequence_goes_to_the_front_of_waiting() -> None:
    sched = make_scheduler(num_blocks=4, max_num_seqs=2)
    a, b = make_seq("a", 8), make_seq("b", 7, first_token=100)
    c = make_seq("c", 3, first_token=200)
    for seq in (a, b, c):
        sched.add(seq)
    step(sched)
    out = step(sched)
    assert out.preempted == [b]
    assert list(sched.waiting) == [b, c]


def test_abort_frees_blocks_and_removes_the_request() -> None:
    sched = make_scheduler()
    seq = make_seq("a", 9)
    sched.add(seq)
    step(sched)
    assert sched.block_manager.num_free_blocks == 13
    assert sched.abort("a") is seq
    assert seq.status is SequenceStatus.FINISHED_ABORTED
    assert seq.block_table == []
    assert sched.block_manager.num_free_blocks == 16
    assert sched.get("a") is None
    assert not sched.has_unfinished()
    assert sched.abort("a") is None


def test_abort_between_schedule_and_update_is_skipped() -> None:
    sched = make_scheduler()
    sched.add(make_seq("a", 9))
    out = sched.schedule()
    sched.abort("a")
    assert sched.update_after_step(out) == []
    assert sched.block_manager.num_free_blocks == 16


def test_finish_can_keep_blocks_for_a_kv_transfer() -> None:
    sched = make_scheduler()
    seq = make_seq("a", 9)
    sched.add(seq)
    step(sched)
    sched.finish(seq, SequenceStatus.FINISHED_LENGTH_CAPPED, free_blocks=False)
    assert not sched.has_unfinished()
    assert seq.block_table == [0, 1, 2]
    sched.block_manager.free(seq)
    assert sched.block_manager.num_free_blocks == 16


def test_external_kv_tokens_are_loaded_not_computed() -> None:
    sched = make_scheduler(budget=4)
    seq = make_seq("a", 10)
    seq.external_kv_tokens = 8
    sched.add(seq)
    out = sched.schedule()
    assert out.kv_loads == [ScheduledKVLoad(seq, start=0, end=8)]
    assert chunk_shape(out) == [("a", 2)]  # loaded tokens use no budget
    assert seq.num_computed_tokens == 8
    assert seq.block_table == [0, 1, 2]


def test_a_fully_transferred_prompt_still_computes_its_last_token() -> None:
    sched = make_scheduler()
    seq = make_seq("a", 10)
    seq.external_kv_tokens = 10
    sched.add(seq)
    out = sched.schedule()
    assert out.kv_loads == [ScheduledKVLoad(seq, start=0, end=9)]
    assert chunk_shape(out) == [("a", 1)]
    assert out.chunks[0].samples


def test_kv_loads_start_after_prefix_hits() -> None:
    sched = make_scheduler()
    sched.add(make_seq("a", 5, max_tokens=1))
    step(sched)
    seq = make_seq("b", 10)
    seq.external_kv_tokens = 8
    sched.add(seq)
    out = sched.schedule()
    assert out.kv_loads == [ScheduledKVLoad(seq, start=4, end=8)]
    assert seq.num_cached_tokens == 4
    assert seq.block_table[0] == 0


def test_prefix_hits_are_counted_in_tokens() -> None:
    sched = make_scheduler()
    sched.add(make_seq("a", 10, max_tokens=1))
    step(sched)
    assert sched.take_step_stats().prefix_cache_hits == 0
    b = make_seq("b", 10)
    sched.add(b)
    out = step(sched)
    assert chunk_shape(out) == [("b", 2)]
    assert b.num_cached_tokens == 8
    assert b.block_table[:2] == [0, 1]
    counters = sched.take_step_stats()
    assert (counters.prefix_cache_queries, counters.prefix_cache_hits) == (10, 8)
    assert sched.take_step_stats().prefix_cache_queries == 0


def test_stats_report_gauges() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.add(make_seq("a", 8))
    sched.add(make_seq("b", 4, first_token=100))
    step(sched)
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting) == (1, 1)
    assert (stats.num_blocks, stats.num_free_blocks) == (16, 14)  # the slot for a's new token comes next step
    assert stats.kv_cache_usage == pytest.approx(2 / 16)


def test_add_rejects_what_can_never_run() -> None:
    sched = make_scheduler(num_blocks=4)
    with pytest.raises(ContextLengthExceeded):
        sched.add(make_seq("too-big", 17))
    sched.add(make_seq("a", 3))
    with pytest.raises(ValueError):
        sched.add(make_seq("a", 3))


# ----- property test -----

NUM_BLOCKS = 8
MAX_SEQ_TOKENS = NUM_BLOCKS * BLOCK_SIZE  # a lone sequence always fits, so progress is always possible
SHARED_PREFIX = list(range(500, 512))

add_op = st.tuples(
    st.just("add"),
    st.integers(1, 20),  # prompt length
    st.integers(1, 8),  # output tokens before the engine finishes it
    st.booleans(),  # starts with a shared prefix
    st.integers(0, 12),  # external_kv_tokens (P/D)
)
operations = st.lists(
    st.one_of(add_op, st.tuples(st.just("step")), st.tuples(st.just("abort"), st.integers(0, 50))),
    max_size=60,
)


def build_seq(request_id: str, prompt_len: int, max_tokens: int, shared: bool, external: int) -> Sequence:
    head = SHARED_PREFIX[:prompt_len] if shared else []
    prompt = head + [hash(request_id) % 97 + i for i in range(prompt_len - len(head))]
    max_tokens = min(max_tokens, MAX_SEQ_TOKENS - prompt_len + 1)
    seq = Sequence(request_id, prompt, SamplingParams(max_tokens=max_tokens))
    seq.external_kv_tokens = external
    return seq


def assert_block_accounting(sched: Scheduler) -> None:
    bm = sched.block_manager
    live = list(sched.running) + list(sched.waiting)
    references: Counter[int] = Counter()
    positions: dict[int, set[int]] = {}
    for seq in live:
        assert len(set(seq.block_table)) == len(seq.block_table), "a block twice in one table"
        if seq.status is SequenceStatus.WAITING:
            assert seq.block_table == [] and seq.num_computed_tokens == 0
        else:
            assert len(seq.block_table) * BLOCK_SIZE >= seq.num_computed_tokens
        for index, block_id in enumerate(seq.block_table):
            references[block_id] += 1
            positions.setdefault(block_id, set()).add(index)
    for block in bm.blocks:
        assert block.ref_count == references[block.block_id]
        if references[block.block_id] > 1:  # only a cached prefix block is shared, at the same position
            assert block.block_hash is not None
            assert len(positions[block.block_id]) == 1
    free = bm.free_block_ids()
    assert len(free) == len(set(free)) == bm.num_free_blocks
    assert set(free) == {b.block_id for b in bm.blocks if b.ref_count == 0}
    assert bm.num_free_blocks + sum(1 for b in bm.blocks if b.ref_count > 0) == bm.num_blocks
    assert sum(b.ref_count for b in bm.blocks) == sum(references.values())


def simulate_step(sched: Scheduler) -> None:
    runnable = sched.has_unfinished()
    output = step(sched)
    assert not (runnable and output.is_empty), "runnable work but an empty step"
    assert output.num_batched_tokens == sum(c.num_new_tokens for c in output.chunks)
    assert len(sched.running) <= sched.config.max_num_seqs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=operations,
    budget=st.sampled_from([4, 8, 16]),
    max_num_seqs=st.integers(1, 4),
    chunked=st.booleans(),
    prefix_caching=st.booleans(),
)
def test_block_accounting_holds_under_any_schedule(
    ops: list[tuple], budget: int, max_num_seqs: int, chunked: bool, prefix_caching: bool
) -> None:
    sched = make_scheduler(NUM_BLOCKS, budget, max_num_seqs, chunked, prefix_caching)
    added: list[str] = []
    for op in ops:
        if op[0] == "add":
            request_id = f"r{len(added)}"
            sched.add(build_seq(request_id, *op[1:]))
            added.append(request_id)
        elif op[0] == "step":
            simulate_step(sched)
        elif added:
            sched.abort(added[op[1] % len(added)])
        assert_block_accounting(sched)
    for _ in range(500):  # drain: every request finishes within a bounded number of steps
        if not sched.has_unfinished():
            break
        simulate_step(sched)
        assert_block_accounting(sched)
    assert not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == NUM_BLOCKS
    assert all(block.ref_count == 0 for block in sched.block_manager.blocks)
