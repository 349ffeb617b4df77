"""The host-DRAM tier: blocks in this process's memory, within a byte limit, evicted by a segmented LRU.

What it evicts is handed back to the caller (the store demotes it to disk). Not thread-safe on its own: the
store (store.py) serialises calls.
"""

from __future__ import annotations

from engine.contract.kv_tier import TierBlock

from agent.kv_tiers.policy import SegmentedLRU

Key = tuple[str, int]  # (layout, block hash)


class DramTier:
    name = "dram"

    def __init__(self, capacity_bytes: int):
        self._policy = SegmentedLRU(capacity_bytes)
        self._blocks: dict[Key, TierBlock] = {}

    @property
    def capacity_bytes(self) -> int:
        return self._policy.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self._policy.used_bytes

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: Key) -> bool:
        return key in self._blocks

    def put(self, block: TierBlock) -> list[TierBlock]:
        """Hold `block`; the blocks evicted to make room (the block itself if it is larger than the tier)."""
        if block.key in self._blocks:
            self._blocks[block.key] = block  # the same address: the same tokens and (checked) bytes
        evicted = self._policy.admit(block.key, block.nbytes)
        self._blocks[block.key] = block
        return [self._blocks.pop(key) for key in evicted]

    def resize(self, capacity_bytes: int) -> list[TierBlock]:
        return [self._blocks.pop(key) for key in self._policy.resize(capacity_bytes)]

    def get(self, key: Key) -> TierBlock | None:
        block = self._blocks.get(key)
        if block is not None:
            self._policy.touch(key)
        return block

    def peek(self, key: Key) -> TierBlock | None:
        """The block without counting a hit (for listing what the tier holds)."""
        return self._blocks.get(key)

    def remove(self, key: Key) -> TierBlock | None:
        self._policy.discard(key)
        return self._blocks.pop(key, None)

    def clear(self) -> list[Key]:
        self._policy.clear()
        keys = list(self._blocks)
        self._blocks.clear()
        return keys

    def keys(self) -> list[Key]:
        return list(self._blocks)
