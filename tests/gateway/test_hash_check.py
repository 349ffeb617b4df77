"""hash_check: an engine's first-block hashes, from its KV events, against the gateway's own for its seed."""

from __future__ import annotations

from engine.hashing import LEGACY_HASH_SEED, VLLM_DEFAULT_HASH_SEED, block_hashes_int64
from engine.kv_events import BlockStored, EventBatch
from fleetctl.gateway.hash_check import MISMATCHES_TO_FLAG, HashChecks, root_block_matches

TOKENS = list(range(100, 132))  # two blocks of 16


def first_block(seed: str, tokens: list[int] = TOKENS, **fields) -> BlockStored:
    hashes = block_hashes_int64(tokens, 16, seed)
    return BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=16, **fields)


def batch(*events) -> EventBatch:
    return EventBatch(ts=0.0, events=list(events))


def test_a_first_block_hashed_with_the_gateways_seed_matches_and_one_with_another_does_not():
    assert root_block_matches(first_block(VLLM_DEFAULT_HASH_SEED), VLLM_DEFAULT_HASH_SEED) is True
    assert root_block_matches(first_block(LEGACY_HASH_SEED), VLLM_DEFAULT_HASH_SEED) is False


def test_blocks_that_cannot_be_checked_say_nothing():
    child = BlockStored(block_hashes=[5], parent_block_hash=7, token_ids=TOKENS[16:], block_size=16)
    assert root_block_matches(child, VLLM_DEFAULT_HASH_SEED) is None  # the parent's full digest is not known
    assert root_block_matches(first_block(LEGACY_HASH_SEED, lora_name="adapter"), VLLM_DEFAULT_HASH_SEED) is None
    short = BlockStored(block_hashes=[5], parent_block_hash=None, token_ids=TOKENS[:8], block_size=16)
    assert root_block_matches(short, VLLM_DEFAULT_HASH_SEED) is None


def test_an_engine_is_flagged_after_mismatches_in_a_row_and_cleared_by_one_match():
    checks = HashChecks(VLLM_DEFAULT_HASH_SEED)
    assert checks.status("e") == "unchecked"
    for i in range(MISMATCHES_TO_FLAG):
        assert checks.status("e") == "unchecked"
        checks.observe("e", batch(first_block(LEGACY_HASH_SEED, [i] * 32)))
    assert checks.status("e") == "hash_mismatch" and checks.mismatched() == ["e"]
    checks.observe("e", batch(first_block(VLLM_DEFAULT_HASH_SEED)))
    assert checks.status("e") == "match" and checks.mismatched() == []


def test_a_matching_engine_stays_matched_and_a_restart_starts_its_record_again():
    checks = HashChecks(LEGACY_HASH_SEED)
    checks.observe("e", batch(first_block(LEGACY_HASH_SEED)))
    assert checks.status("e") == "match" and checks.record("e").checked == 1
    checks.reset("e")
    assert checks.status("e") == "unchecked" and checks.record("e").checked == 0
