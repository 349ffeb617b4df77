"""PrefixIndex: events in, leading-block counts out; exact hashes, exact eviction order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.hashing import block_hashes_int64
from engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from fleetctl.gateway.prefix_index import PrefixHit, PrefixIndex, SeqCheck, tier_of

PROMPT = list(range(1000, 1000 + 16 * 6))  # six full blocks
HASHES = block_hashes_int64(PROMPT)


def stored(hashes: list[int], medium: str | None = "GPU") -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[], block_size=16, medium=medium)


def batch(*events) -> EventBatch:
    return EventBatch(ts=0.0, events=list(events), data_parallel_rank=0)


def test_longest_prefix_counts_leading_blocks_and_stops_at_first_miss():
    index = PrefixIndex()
    index.apply_event("a", stored(HASHES[:4]))
    index.apply_event("b", stored(HASHES[:1] + HASHES[2:6]))  # holds every block but the second
    index.apply_event("c", stored(HASHES))

    assert index.longest_prefix(HASHES) == {"a": 4, "b": 1, "c": 6}
    assert index.longest_prefix(HASHES, ["a", "unknown"]) == {"a": 4, "unknown": 0}
    assert index.longest_prefix([]) == {"a": 0, "b": 0, "c": 0}


def test_removed_blocks_cut_the_prefix_where_they_were():
    index = PrefixIndex()
    index.apply_event("a", stored(HASHES))
    index.apply_event("a", BlockRemoved(block_hashes=[HASHES[3]]))
    assert index.longest_prefix(HASHES) == {"a": 3}
    index.apply_event("a", BlockRemoved(block_hashes=[999]))  # unknown hash: ignored
    assert index.num_blocks("a") == 5


def test_all_blocks_cleared_removes_only_that_engines_blocks():
    index = PrefixIndex()
    index.apply_event("a", stored(HASHES))
    index.apply_event("b", stored(HASHES[:2]))
    index.apply_event("a", AllBlocksCleared())
    assert index.longest_prefix(HASHES) == {"a": 0, "b": 2}
    assert index.num_blocks("a") == 0


def test_all_blocks_cleared_leaves_the_blocks_a_node_tier_holds():
    index = PrefixIndex()
    index.apply_event("a", stored(HASHES[:4]))
    index.apply_event("a", stored(HASHES[:2], medium="CPU"))
    index.apply_event("a", AllBlocksCleared())  # the engine reset its own prefix cache, not its node's tier
    assert index.prefix_hits(HASHES, ["a"])["a"] == PrefixHit(0, (("CPU", 2),))
    assert index.num_blocks("a") == 2


def test_a_block_stays_while_any_medium_holds_it():
    index = PrefixIndex()
    index.apply_event("a", stored(HASHES[:2], medium=None))  # no medium: GPU
    index.apply_event("a", stored(HASHES[:2], medium="CPU"))  # offloaded copy
    index.apply_event("a", BlockRemoved(block_hashes=HASHES[:2], medium="GPU"))
    assert index.longest_prefix(HASHES) == {"a": 2}
    index.apply_event("a", BlockRemoved(block_hashes=HASHES[:2], medium="CPU"))
    assert index.longest_prefix(HASHES) == {"a": 0}


def test_per_engine_cap_evicts_least_recently_used_hash():
    index = PrefixIndex(max_blocks_per_engine=3)
    index.apply_event("a", stored([1, 2, 3]))
    index.touch("a", [1])  # 1 was used by a routed request: now 2 is the oldest
    index.apply_event("a", stored([4]))
    assert [h for h in (1, 2, 3, 4) if index.holds("a", h)] == [1, 3, 4]
    index.apply_event("a", stored([5, 6]))
    assert [h for h in (1, 3, 4, 5, 6) if index.holds("a", h)] == [4, 5, 6]
    assert index.stats.evictions == 3
    index.apply_event("b", stored([1, 2, 3]))  # the cap is per engine
    assert index.num_blocks("b") == 3 and index.num_blocks("a") == 3


def test_drop_engine_forgets_blocks_and_sequence():
    index = PrefixIndex()
    index.apply_batch("a", 0, batch(stored(HASHES)))
    index.apply_batch("b", 0, batch(stored(HASHES)))
    index.drop_engine("a")
    assert index.longest_prefix(HASHES) == {"b": 6}
    assert index.last_seq("a") is None and index.engines() == ["b"]


def test_sequence_numbers_detect_duplicates_and_gaps():
    index = PrefixIndex()
    assert index.apply_batch("a", 5, batch(stored(HASHES[:1]))) is SeqCheck.APPLIED  # first seen: any number
    assert index.next_seq("a") == 6
    assert index.apply_batch("a", 5, batch(stored(HASHES[1:2]))) is SeqCheck.DUPLICATE
    assert index.apply_batch("a", 8, batch(stored(HASHES[1:2]))) is SeqCheck.GAP
    assert index.longest_prefix(HASHES) == {"a": 1}  # neither was applied
    assert index.apply_batch("a", 6, batch(stored(HASHES[1:2]))) is SeqCheck.APPLIED
    assert index.apply_batch("a", 9, batch(stored(HASHES[2:3])), allow_gap=True) is SeqCheck.APPLIED
    assert index.longest_prefix(HASHES) == {"a": 3}
    assert (index.stats.duplicates_ignored, index.stats.gaps_detected, index.stats.gaps_accepted) == (1, 1, 1)


def test_reset_engine_keeps_it_known_with_no_blocks():
    index = PrefixIndex()
    index.apply_batch("a", 3, batch(stored(HASHES)))
    index.reset_engine("a")
    assert index.longest_prefix(HASHES) == {"a": 0} and index.next_seq("a") == 0


operations = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["store", "remove", "clear"]), st.lists(st.integers(0, 7), max_size=4)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(operations, st.lists(st.integers(0, 7), max_size=6))
def test_longest_prefix_matches_a_plain_model(ops, request_hashes):
    index, model = PrefixIndex(), {"a": set(), "b": set(), "c": set()}
    for engine, kind, hashes in ops:
        if kind == "store":
            index.apply_event(engine, stored(hashes))
            model[engine] |= set(hashes)
        elif kind == "remove":
            index.apply_event(engine, BlockRemoved(block_hashes=hashes))
            model[engine] -= set(hashes)
        else:
            index.apply_event(engine, AllBlocksCleared())
            model[engine].clear()

    def leading(held: set[int]) -> int:
        count = 0
        while count < len(request_hashes) and request_hashes[count] in held:
            count += 1
        return count

    assert index.longest_prefix(request_hashes, ["a", "b", "c"]) == {e: leading(h) for e, h in model.items()}


def test_prefix_hits_split_memory_then_the_cheapest_tier_holding_each_block():
    index = PrefixIndex()
    index.apply_event("a", stored(HASHES[:2]))  # memory holds blocks 0-1
    index.apply_event("a", stored(HASHES[:4], medium="CPU"))  # DRAM tier holds 0-3
    index.apply_event("a", stored(HASHES[3:5], medium="STORAGE"))  # disk holds 3-4 (3 is also in DRAM)
    index.apply_event("b", stored(HASHES[:3], medium="DISK"))  # Dynamo's alias for the disk tier
    index.apply_event("c", stored(HASHES[:6]))

    hits = index.prefix_hits(HASHES, ["a", "b", "c", "none"])

    assert hits["a"] == PrefixHit(2, (("CPU", 2), ("STORAGE", 1)))
    assert hits["a"].blocks == 5
    assert hits["b"] == PrefixHit(0, (("STORAGE", 3),))
    assert hits["c"] == PrefixHit(6, ())
    assert "none" not in hits


def test_a_block_only_in_memory_after_a_tier_run_ends_the_run():
    index = PrefixIndex()
    index.apply_event("a", stored([HASHES[0], HASHES[2]]))  # memory: 0 and 2, not 1
    index.apply_event("a", stored([HASHES[1]], medium="CPU"))
    # the engine takes 0 from memory and fetches 1; block 2 is not in a tier, so its fetch stops there, and its
    # own cache cannot use block 2 after a block it loaded from elsewhere: the reusable run is two blocks
    assert index.prefix_hits(HASHES, ["a"])["a"] == PrefixHit(1, (("CPU", 1),))


def test_medium_names_fold_as_dynamos_router_folds_them():
    assert [tier_of(m) for m in ("GPU", "device", "CPU_PINNED", "cpu", "NVME", "STORAGE", "SHARED", "weird")] == [
        "GPU", "GPU", "CPU", "CPU", "STORAGE", "STORAGE", "EXTERNAL", "EXTERNAL"]
