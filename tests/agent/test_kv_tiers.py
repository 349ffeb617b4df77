"""The node's KV tiers: the block frame, the segmented LRU, the DRAM and disk tiers and the store over both."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.kv_tiers.disk import DiskTier
from agent.kv_tiers.policy import SegmentedLRU
from agent.kv_tiers.store import TierStore
from engine.contract.kv_tier import (TierBlock, TierFrameError, decode_tier_frame, encode_tier_frame,
                                     kv_layout_key)
from engine.kv_events import BlockRemoved, BlockStored

LAYOUT = kv_layout_key(weights="tiny", weights_revision="main", dtype="float32", kv_cache_dtype="float32",
                       rope_scaling=None, block_size=4, block_shape=[2, 2, 4, 1, 8])


def events(store: TierStore, after: int = 0) -> list:
    page = store.events_since(LAYOUT, after)
    assert page.snapshot is None
    return page.events


def block(n: int, size: int = 100, layout: str = LAYOUT) -> TierBlock:
    payload = bytes((n + i) % 256 for i in range(size))
    return TierBlock.make(layout, n, (n, n + 1, n + 2, n + 3), payload)


def test_layout_key_changes_with_every_correctness_field_of_the_kv():
    base = dict(weights="smollm2", weights_revision="main", dtype="float32", kv_cache_dtype="float32",
                rope_scaling=None, block_size=16, block_shape=[30, 2, 16, 3, 64])
    changed = [dict(base, kv_cache_dtype="float16"), dict(base, rope_scaling=4.0), dict(base, weights="tiny"),
               dict(base, dtype="bfloat16"), dict(base, block_size=32), dict(base, weights_revision="r2")]
    keys = {kv_layout_key(**fields) for fields in [base, *changed]}
    assert len(keys) == 1 + len(changed)
    assert kv_layout_key(**base) == kv_layout_key(**dict(base))


def test_frame_round_trip_is_bit_exact():
    blocks = [block(1, 64), block(2, 0), block(3, 4097)]
    layout, decoded = decode_tier_frame(encode_tier_frame(LAYOUT, blocks))
    assert layout == LAYOUT and decoded == blocks


@pytest.mark.parametrize("where", ["payload", "tokens", "header-length"])
def test_a_corrupted_frame_is_refused_whole(where):
    frame = bytearray(encode_tier_frame(LAYOUT, [block(1), block(2)]))
    if where == "payload":
        frame[-5] ^= 0x01
    elif where == "tokens":
        at = frame.index(b'"tokens":[1,')
        frame[at + len(b'"tokens":[')] = ord("7")
    else:
        frame[3] = 0xFF
    with pytest.raises(TierFrameError):
        decode_tier_frame(bytes(frame))


def test_segmented_lru_keeps_blocks_hit_again_through_a_scan():
    lru = SegmentedLRU(capacity_bytes=10, protected_share=0.5)
    for key in "ab":
        lru.admit(key, 1)
        lru.touch(key)  # hit again: protected
    evicted = []
    for key in "cdefghijklmnop":  # a scan of blocks used once
        evicted += lru.admit(key, 1)
    assert "a" in lru and "b" in lru
    assert evicted[:4] == ["c", "d", "e", "f"] and lru.used_bytes == 10


def test_segmented_lru_refuses_a_block_larger_than_the_tier():
    lru = SegmentedLRU(capacity_bytes=10)
    lru.admit("a", 5)
    assert lru.admit("big", 11) == ["big"]
    assert "big" not in lru and "a" in lru and lru.used_bytes == 5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "get", "flush"]), st.integers(0, 30), st.integers(1, 300)),
                max_size=120),
       st.integers(0, 1500), st.integers(0, 3000))
def test_tier_sizes_hold_under_a_random_workload(tmp_path_factory, ops, dram_bytes, disk_bytes):
    store = TierStore(dram_bytes, tmp_path_factory.mktemp("disk"), disk_bytes)
    store.open()
    for op, n, size in ops:
        if op == "put":
            store.offload([block(n, size)])
        elif op == "get":
            got = store.fetch(LAYOUT, [n], [block(n).token_ids])
            assert all(b.intact() and b.block_hash == n for b in got.blocks)
        else:
            store.flush("dram")
        dram, *disk = store.status()
        assert dram.used_bytes <= dram_bytes and dram.blocks == len(store.dram)
        if disk:
            assert disk[0].used_bytes <= disk_bytes
            files = [p for p in (store.disk.root).rglob("*.kvb")]
            assert len(files) == disk[0].blocks
            assert sum(p.stat().st_size for p in files) >= disk[0].used_bytes


def test_dram_evictions_go_to_disk_and_a_disk_hit_comes_back_to_dram(tmp_path):
    store = TierStore(dram_bytes=250, disk_root=tmp_path, disk_bytes=10_000)
    store.open()
    store.offload([block(1), block(2), block(3)])  # 300 bytes into 250: block 1 goes to disk
    assert store.holds(LAYOUT, [1, 2, 3]) == ["disk", "dram", "dram"]
    got = store.fetch(LAYOUT, [1], [block(1).token_ids])
    assert got.media == ["disk"] and got.blocks == [block(1)]
    assert store.holds(LAYOUT, [1, 2, 3]) == ["dram", "disk", "dram"]  # promoted; 2, least recent, went down
    media = {(type(e).__name__, e.medium, e.block_hashes[0]) for e in events(store)}
    assert ("BlockStored", "STORAGE", 1) in media and ("BlockRemoved", "CPU", 1) in media
    assert ("BlockStored", "CPU", 1) in media  # promoted back


def test_fetch_stops_at_the_first_block_whose_tokens_differ(tmp_path):
    store = TierStore(dram_bytes=10_000)
    store.offload([block(1), block(2), block(3)])
    got = store.fetch(LAYOUT, [1, 2, 3], [block(1).token_ids, (9, 9, 9, 9), block(3).token_ids])
    assert got.blocks == [block(1)] and got.token_mismatches == 1


def test_a_block_of_another_layout_is_never_returned():
    other = kv_layout_key(weights="tiny", weights_revision="main", dtype="float32", kv_cache_dtype="float16",
                          rope_scaling=None, block_size=4, block_shape=[2, 2, 4, 1, 8])
    store = TierStore(dram_bytes=10_000)
    store.offload([block(1, layout=other)])
    assert store.fetch(LAYOUT, [1], [block(1).token_ids]).blocks == []
    assert store.fetch(other, [1], [block(1).token_ids]).blocks == [block(1, layout=other)]


def test_disk_index_is_rebuilt_on_restart_and_corrupt_files_are_dropped(tmp_path):
    first = TierStore(dram_bytes=0, disk_root=tmp_path, disk_bytes=10_000)
    first.open()
    first.offload([block(n) for n in range(5)])  # DRAM of 0 bytes (a disk-only class): straight to disk
    assert first.counters.refused == 0 and len(first.disk) == 5
    victim = first.disk.path_of((LAYOUT, 3))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    (tmp_path / LAYOUT / "zz.tmp").write_bytes(b"half a block")
    restarted = TierStore(dram_bytes=1_000, disk_root=tmp_path, disk_bytes=10_000)
    report = restarted.open()
    assert (report.blocks, report.corrupt, report.stale) == (4, 1, 1)
    assert restarted.holds(LAYOUT, [0, 1, 2]) == ["disk"] * 3
    assert restarted.fetch(LAYOUT, [3], [block(3).token_ids]).blocks == []
    assert not victim.exists()


def test_a_block_no_tier_can_hold_is_refused():
    store = TierStore(dram_bytes=50)
    assert store.offload([block(1, size=100)]) == 0 and store.counters.refused == 1 and len(store.dram) == 0


def test_resizing_evicts_what_no_longer_fits_and_demotes_it(tmp_path):
    store = TierStore(dram_bytes=1_000, disk_root=tmp_path, disk_bytes=10_000)
    store.open()
    store.offload([block(n) for n in range(5)])
    store.resize(dram_bytes=250, disk_bytes=10_000)
    assert store.holds(LAYOUT, [0, 1, 2, 3, 4]) == ["disk", "disk", "disk", "dram", "dram"]
    store.resize(dram_bytes=250, disk_bytes=100)
    assert len(store.disk) == 1 and store.status()[1].used_bytes <= 100


def test_a_block_corrupted_after_start_is_a_miss_and_is_deleted(tmp_path):
    store = TierStore(dram_bytes=0, disk_root=tmp_path, disk_bytes=10_000)
    store.open()
    store.disk.put(block(7))
    path = store.disk.path_of((LAYOUT, 7))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    assert store.fetch(LAYOUT, [7], [block(7).token_ids]).blocks == []
    assert not path.exists() and store.status()[1].corrupt == 1


def test_the_disk_tier_switched_off_is_neither_written_nor_read(tmp_path):
    store = TierStore(dram_bytes=150, disk_root=tmp_path, disk_bytes=10_000)
    store.open()
    store.offload([block(1)])
    store.set_disk_enabled(False)
    store.offload([block(2)])  # block 1 is evicted from DRAM and dropped
    assert store.holds(LAYOUT, [1]) == [] and len(store.disk) == 0
    store.set_disk_enabled(True)
    store.offload([block(3)])  # block 2 goes to disk
    assert store.holds(LAYOUT, [2, 3]) == ["disk", "dram"]


def test_flush_one_tier(tmp_path):
    store = TierStore(dram_bytes=150, disk_root=tmp_path, disk_bytes=10_000)
    store.open()
    store.offload([block(1), block(2)])
    assert store.flush("disk") == {"disk": 1}
    assert store.holds(LAYOUT, [2]) == ["dram"] and store.holds(LAYOUT, [1]) == []
    assert store.flush() == {"dram": 1, "disk": 0}
    removed = [e for e in events(store) if isinstance(e, BlockRemoved)]
    assert {(e.medium, e.block_hashes[0]) for e in removed} >= {("STORAGE", 1), ("CPU", 2)}


def test_hit_rate_and_fetch_time_are_counted_per_tier(tmp_path):
    ticks = iter(x * 0.5 for x in range(1000))
    store = TierStore(dram_bytes=150, disk_root=tmp_path, disk_bytes=10_000, clock=lambda: next(ticks))
    store.open()
    store.offload([block(1), block(2)])  # 1 on disk, 2 in DRAM
    store.fetch(LAYOUT, [2], [block(2).token_ids])
    store.fetch(LAYOUT, [4], [block(4).token_ids])
    dram, disk = store.status()
    assert (dram.hits, dram.misses, dram.hit_rate) == (1, 1, 0.5)
    assert dram.mean_fetch_s == 0.5 and disk.fetches == 0


def test_stored_events_name_the_tier_in_vllms_vocabulary():
    store = TierStore(dram_bytes=10_000)
    store.offload([block(5)])
    (event,) = events(store)
    assert isinstance(event, BlockStored) and event.medium == "CPU" and event.block_hashes == [5]


def test_a_reader_follows_the_event_log_by_number_and_only_sees_its_layout(tmp_path):
    other = kv_layout_key(weights="tiny", weights_revision="main", dtype="float32", kv_cache_dtype="float16",
                          rope_scaling=None, block_size=4, block_shape=[2, 2, 4, 1, 4])
    store = TierStore(dram_bytes=10_000)
    first = store.events_since(LAYOUT, -1)  # a new reader: a snapshot of nothing
    assert first.snapshot == {} and first.seq == 0
    store.offload([block(1), block(2, layout=other)])
    page = store.events_since(LAYOUT, first.seq)
    assert page.snapshot is None and [e.block_hashes for e in page.events] == [[1]] and page.seq == 2
    assert store.events_since(LAYOUT, page.seq).events == []


def test_a_reader_that_fell_out_of_the_log_or_is_ahead_of_it_gets_a_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.kv_tiers.store.EVENT_LOG_SIZE", 10)
    store = TierStore(dram_bytes=250, disk_root=tmp_path, disk_bytes=10_000)
    store.open()
    store.offload([block(n) for n in range(1, 5)])  # 4 blocks into 250 bytes of DRAM: two go down to disk
    assert store.events_since(LAYOUT, 0).snapshot is None
    store.offload([block(5)])  # more events than the log keeps
    page = store.events_since(LAYOUT, 0)
    assert page.snapshot is not None and page.events == []
    assert page.snapshot == {h: [m] for h, m in zip(range(1, 6), ["STORAGE", "STORAGE", "STORAGE", "CPU", "CPU"])}
    assert store.events_since(LAYOUT, page.seq + 10).snapshot == page.snapshot  # the agent restarted under it


def test_switching_the_disk_tier_off_and_on_removes_and_restores_its_blocks_for_readers(tmp_path):
    store = TierStore(dram_bytes=150, disk_root=tmp_path, disk_bytes=10_000)
    store.open()
    store.offload([block(1), block(2)])  # 1 on disk
    seq = store.events_since(LAYOUT, -1).seq
    store.set_disk_enabled(False)
    page = store.events_since(LAYOUT, seq)
    assert [(type(e).__name__, e.medium, e.block_hashes) for e in page.events] == [("BlockRemoved", "STORAGE", [1])]
    assert store.events_since(LAYOUT, -1).snapshot == {2: ["CPU"]}
    store.set_disk_enabled(True)
    assert [(type(e).__name__, e.medium) for e in store.events_since(LAYOUT, page.seq).events] == [("BlockStored", "STORAGE")]


def test_a_corrupt_disk_block_leaves_the_readers_view(tmp_path):
    store = TierStore(dram_bytes=150, disk_root=tmp_path, disk_bytes=10_000)
    store.open()
    store.offload([block(1), block(2)])  # 1 on disk
    path = store.disk.path_of((LAYOUT, 1))
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    seq = store.events_since(LAYOUT, -1).seq
    assert store.fetch(LAYOUT, [1], [block(1).token_ids]).blocks == []
    assert [(type(e).__name__, e.medium) for e in store.events_since(LAYOUT, seq).events] == [("BlockRemoved", "STORAGE")]
