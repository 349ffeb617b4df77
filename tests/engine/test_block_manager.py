"""BlockManager on tiny pools: exact block ids, eviction order, prefix hits and KV events."""

from __future__ import annotations

import pytest

from engine.hashing import block_hashes, block_hashes_int64, to_int64
from engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from engine.reference.block_manager import BlockManager
from engine.reference.sequence import Sequence

BLOCK_SIZE = 4
SEED = "0"


def make_seq(request_id: str, token_ids: list[int]) -> Sequence:
    return Sequence(request_id=request_id, prompt_token_ids=list(token_ids))


def compute_all(bm: BlockManager, seq: Sequence, computed_blocks: list[int] | None = None) -> None:
    """Allocate and 'compute' seq's whole prompt, then cache its full blocks (what one prefill step does)."""
    num_hit = len(computed_blocks or []) * bm.block_size
    assert bm.allocate_slots(seq, seq.num_tokens - num_hit, computed_blocks)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)


def hash_of(token_ids: list[int], index: int) -> bytes:
    return block_hashes(token_ids, BLOCK_SIZE, SEED)[index]


@pytest.fixture
def bm() -> BlockManager:
    return BlockManager(num_blocks=8, block_size=BLOCK_SIZE, hash_seed=SEED)


def test_allocation_takes_lowest_free_ids_in_order(bm: BlockManager) -> None:
    a, b = make_seq("a", range(10)), make_seq("b", range(100, 105))
    assert bm.allocate_slots(a, 10)
    assert bm.allocate_slots(b, 5)
    assert a.block_table == [0, 1, 2]
    assert b.block_table == [3, 4]
    assert bm.free_block_ids() == [5, 6, 7]
    assert bm.num_free_blocks == 3
    assert bm.usage == pytest.approx(5 / 8)


def test_allocate_grows_the_table_one_slot_at_a_time(bm: BlockManager) -> None:
    seq = make_seq("a", range(4))
    assert bm.allocate_slots(seq, 4)
    seq.num_computed_tokens = 4
    seq.append_token(99)
    assert bm.allocate_slots(seq, 1)  # position 4 starts a new block
    assert seq.block_table == [0, 1]
    seq.num_computed_tokens = 5
    seq.append_token(98)
    assert bm.allocate_slots(seq, 1)  # position 5 fits in block 1
    assert seq.block_table == [0, 1]


def test_no_capacity_returns_false_and_changes_nothing(bm: BlockManager) -> None:
    a = make_seq("a", range(28))
    assert bm.allocate_slots(a, 28)  # 7 blocks
    b = make_seq("b", range(100, 109))
    assert not bm.allocate_slots(b, 9)  # needs 3, 1 free
    assert b.block_table == []
    assert bm.free_block_ids() == [7]
    assert [blk.ref_count for blk in bm.blocks] == [1] * 7 + [0]


def test_free_releases_in_reverse_so_the_tail_is_evicted_first(bm: BlockManager) -> None:
    seq = make_seq("a", range(10))
    assert bm.allocate_slots(seq, 10)
    bm.free(seq)
    assert seq.block_table == []
    assert bm.free_block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]
    bm.free(seq)  # freeing again is a no-op, not a double free
    assert bm.num_free_blocks == 8
    assert all(blk.ref_count == 0 for blk in bm.blocks)


def test_prefix_hit_reuses_the_same_block_ids(bm: BlockManager) -> None:
    prompt = list(range(10))
    a = make_seq("a", prompt)
    compute_all(bm, a)
    b = make_seq("b", prompt)
    computed, num_hit = bm.get_computed_blocks(b)
    assert (computed, num_hit) == ([0, 1], 8)
    assert bm.blocks[0].ref_count == 1  # lookup alone takes no reference
    assert bm.allocate_slots(b, 2, computed)
    assert b.block_table == [0, 1, 3]
    assert [bm.blocks[i].ref_count for i in (0, 1, 2, 3)] == [2, 2, 1, 1]


def test_lookup_never_returns_the_whole_prompt(bm: BlockManager) -> None:
    prompt = list(range(8))
    compute_all(bm, make_seq("a", prompt))
    assert bm.get_computed_blocks(make_seq("b", prompt)) == ([0], 4)
    assert bm.get_computed_blocks(make_seq("c", prompt + [8])) == ([0, 1], 8)


def test_lookup_stops_at_the_first_miss(bm: BlockManager) -> None:
    compute_all(bm, make_seq("a", list(range(12))))
    diverged = list(range(4)) + [50, 51, 52, 53] + list(range(8, 13))
    assert bm.get_computed_blocks(make_seq("b", diverged)) == ([0], 4)


def test_freed_cached_blocks_still_hit_until_evicted(bm: BlockManager) -> None:
    prompt = list(range(12))
    a = make_seq("a", prompt)
    compute_all(bm, a)
    bm.free(a)
    assert bm.free_block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]
    b = make_seq("b", prompt + [12])
    computed, num_hit = bm.get_computed_blocks(b)
    assert (computed, num_hit) == ([0, 1, 2], 12)
    assert bm.allocate_slots(b, 1, computed)
    assert b.block_table == [0, 1, 2, 3]
    assert bm.free_block_ids() == [4, 5, 6, 7]  # revived blocks left the free queue


def test_lru_eviction_takes_the_tail_block_and_emits_block_removed(bm: BlockManager) -> None:
    prompt = list(range(12))
    a = make_seq("a", prompt)
    compute_all(bm, a)
    bm.free(a)
    bm.take_events()
    big = make_seq("big", range(100, 124))
    assert bm.allocate_slots(big, 24)  # 6 blocks: 3..7, then the LRU cached block 2 (a's tail)
    assert big.block_table == [3, 4, 5, 6, 7, 2]
    assert bm.take_events() == [BlockRemoved(block_hashes=[to_int64(hash_of(prompt, 2))])]
    assert bm.blocks[2].block_hash is None
    assert bm.cached_block_id(hash_of(prompt, 2)) is None
    assert bm.get_computed_blocks(make_seq("c", prompt + [12])) == ([0, 1], 8)


def test_eviction_order_follows_free_order(bm: BlockManager) -> None:
    first, second = make_seq("first", range(4)), make_seq("second", range(10, 14))
    compute_all(bm, first)
    compute_all(bm, second)
    bm.free(second)
    bm.free(first)
    bm.take_events()
    assert bm.allocate_slots(make_seq("x", range(100, 124)), 24)  # 2..7
    assert bm.take_events() == []
    assert bm.allocate_slots(make_seq("y", range(200, 204)), 4)  # evicts second's block (freed first)
    assert bm.take_events() == [BlockRemoved([to_int64(hash_of(list(range(10, 14)), 0))])]


def test_revived_blocks_are_not_evicted_by_the_same_allocation() -> None:
    bm = BlockManager(num_blocks=3, block_size=BLOCK_SIZE, hash_seed=SEED)
    prompt = list(range(8))
    a = make_seq("a", prompt)
    compute_all(bm, a)
    bm.free(a)  # free queue [2, 1, 0]
    x = make_seq("x", range(100, 103))
    assert bm.allocate_slots(x, 3)  # takes 2
    bm.free(x)  # free queue [1, 0, 2]
    bm.take_events()
    b = make_seq("b", prompt + [8])
    computed, _ = bm.get_computed_blocks(b)
    assert bm.allocate_slots(b, 1, computed)
    assert b.block_table == [0, 1, 2]
    assert bm.take_events() == []


def test_revived_blocks_count_against_capacity() -> None:
    bm = BlockManager(num_blocks=3, block_size=BLOCK_SIZE, hash_seed=SEED)
    prompt = list(range(8))
    a = make_seq("a", prompt)
    compute_all(bm, a)
    bm.free(a)
    b = make_seq("b", prompt + list(range(8, 13)))  # 13 tokens: 2 hit blocks + 2 new > 3 blocks
    computed, _ = bm.get_computed_blocks(b)
    assert computed == [0, 1]
    assert not bm.allocate_slots(b, 5, computed)
    assert b.block_table == []
    assert bm.free_block_ids() == [2, 1, 0]
    assert all(blk.ref_count == 0 for blk in bm.blocks)


def test_token_check_rejects_a_hash_collision(bm: BlockManager) -> None:
    prompt = list(range(10))
    compute_all(bm, make_seq("a", prompt))
    bm.blocks[0].token_ids = (7, 7, 7, 7)  # same hash, different tokens: a collision
    assert bm.get_computed_blocks(make_seq("b", prompt)) == ([], 0)


def test_block_stored_events_carry_chained_int64_hashes(bm: BlockManager) -> None:
    prompt = list(range(10))
    seq = make_seq("a", prompt)
    compute_all(bm, seq)
    expected = block_hashes_int64(prompt, BLOCK_SIZE, SEED)
    assert bm.take_events() == [
        BlockStored(block_hashes=expected, parent_block_hash=None, token_ids=prompt[:8], block_size=BLOCK_SIZE)
    ]
    for token in (10, 11):  # decode two tokens: block 2 becomes full
        seq.append_token(token)
        assert bm.allocate_slots(seq, 1)
        seq.num_computed_tokens += 1
        bm.cache_full_blocks(seq)
    seq.num_computed_tokens = 12
    bm.cache_full_blocks(seq)
    all_tokens = prompt + [10, 11]
    assert bm.take_events() == [
        BlockStored(
            block_hashes=[block_hashes_int64(all_tokens, BLOCK_SIZE, SEED)[2]],
            parent_block_hash=expected[1],
            token_ids=[8, 9, 10, 11],
            block_size=BLOCK_SIZE,
        )
    ]


def test_cache_full_blocks_waits_for_computed_tokens(bm: BlockManager) -> None:
    seq = make_seq("a", range(10))
    assert bm.allocate_slots(seq, 10)
    seq.num_computed_tokens = 6  # a chunk of 6: only block 0 is full and computed
    bm.cache_full_blocks(seq)
    assert [e.block_hashes for e in bm.take_events()] == [block_hashes_int64(list(range(4)), BLOCK_SIZE, SEED)]
    assert bm.blocks[1].block_hash is None


def test_duplicate_blocks_keep_the_first_and_emit_once(bm: BlockManager) -> None:
    prompt = list(range(8))
    a, b = make_seq("a", prompt), make_seq("b", prompt)
    assert bm.allocate_slots(a, 8) and bm.allocate_slots(b, 8)  # same step: neither is cached yet
    for seq in (a, b):
        seq.num_computed_tokens = 8
        bm.cache_full_blocks(seq)
    assert len(bm.take_events()) == 1
    assert bm.cached_block_id(hash_of(prompt, 0)) == 0
    assert [bm.blocks[i].block_hash for i in b.block_table] == [None, None]
    bm.free(b)
    bm.free(a)
    assert bm.get_computed_blocks(make_seq("c", prompt + [8])) == ([0, 1], 8)


def test_a_hit_followed_by_new_blocks_emits_only_the_new_ones(bm: BlockManager) -> None:
    prompt = list(range(8))
    compute_all(bm, make_seq("a", prompt))
    bm.take_events()
    longer = prompt + list(range(8, 13))
    b = make_seq("b", longer)
    computed, _ = bm.get_computed_blocks(b)
    compute_all(bm, b, computed)
    expected = block_hashes_int64(longer, BLOCK_SIZE, SEED)
    assert bm.take_events() == [BlockStored([expected[2]], expected[1], longer[8:12], BLOCK_SIZE)]


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use(bm: BlockManager) -> None:
    prompt = list(range(10))
    a = make_seq("a", prompt)
    compute_all(bm, a)
    bm.take_events()
    assert not bm.reset_prefix_cache()
    assert bm.take_events() == []
    assert bm.cached_block_id(hash_of(prompt, 0)) == 0
    bm.free(a)
    assert bm.reset_prefix_cache()
    assert bm.take_events() == [AllBlocksCleared()]
    assert bm.get_computed_blocks(make_seq("b", prompt)) == ([], 0)
    assert all(blk.block_hash is None for blk in bm.blocks)


def test_prefix_caching_off_has_no_hashes_hits_or_events() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    prompt = list(range(10))
    a = make_seq("a", prompt)
    compute_all(bm, a)
    bm.free(a)
    assert bm.get_computed_blocks(make_seq("b", prompt)) == ([], 0)
    assert all(blk.block_hash is None for blk in bm.blocks)
    assert bm.reset_prefix_cache()
    assert bm.take_events() == []


def test_take_events_drains(bm: BlockManager) -> None:
    compute_all(bm, make_seq("a", range(4)))
    assert len(bm.take_events()) == 1
    assert bm.take_events() == []
