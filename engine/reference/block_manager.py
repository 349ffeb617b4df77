"""The paged KV pool's bookkeeping: block tables, ref counts, the prefix cache by chained hash, LRU eviction.

Plain Python over plain objects (as nano-vllm's block_manager and vLLM v1's KVCacheManager); no tensors.
The model runner owns the K/V tensors; this module only decides which block ids hold which positions.

Invariants (tests/engine/test_block_manager.py checks them):
- Every block is either in use (ref_count > 0, referenced by exactly ref_count live block tables) or in the
  free queue (ref_count == 0), never both: num_free_blocks + blocks in use == num_blocks.
- The free queue is LRU: freed blocks go to the back, allocation takes from the front. A free block keeps its
  hash, so it is still a prefix-cache hit until allocation evicts it (BlockRemoved).
- `_cached` maps a hash to the one block that holds it, and a block has a hash iff `_cached` maps its hash to
  it. Only full blocks are hashed; if two sequences compute the same block, the first one registered is
  cached and the duplicate stays unhashed (so every BlockStored is followed by at most one BlockRemoved).
- A hit is accepted only if the cached block's tokens equal the lookup's tokens (guards against collisions).

Prefix-cache stats: `get_computed_blocks` returns the hit tokens; the scheduler counts queries (the sequence's
tokens) and hits once per admission, so a head of line that waits for blocks is not counted every step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.hashing import DEFAULT_HASH_SEED, BlockHash, hash_block_tokens, to_int64
from engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from engine.reference.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class EvictedBlock:
    """A hashed block the pool is about to reuse, for the node's KV tier: its K/V is still intact until the
    next forward pass writes the new owner's (llm_engine exports it before that)."""

    block_id: int
    block_hash: BlockHash
    token_ids: tuple[int, ...]


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None  # set once the block is full and registered in the prefix cache
    token_ids: tuple[int, ...] = ()  # the tokens behind block_hash, for the token check on a hit


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_seed: str = DEFAULT_HASH_SEED,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_seed = hash_seed
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, int] = {}  # hash -> the block id that holds it
        # Per request: chained hashes of its full blocks computed so far (incremental hashing) ...
        self._seq_hashes: dict[str, list[BlockHash]] = {}
        # ... and how many leading blocks of its block table cache_full_blocks has already handled.
        self._num_handled_blocks: dict[str, int] = {}
        self._events: list[KVEvent] = []
        # Set when the engine offloads evictions to a KV tier: then each eviction is also listed here.
        self.record_evictions = False
        self._evicted: list[EvictedBlock] = []

    # ----- gauges -----

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (ref_count > 0), 0..1. Free cached blocks count as free."""
        return (self.num_blocks - self.num_free_blocks) / self.num_blocks

    def free_block_ids(self) -> list[int]:
        """The free queue, next to be allocated (evicted) first."""
        return list(self._free)

    def cached_block_id(self, block_hash: BlockHash) -> int | None:
        return self._cached.get(block_hash)

    # ----- prefix cache lookup -----

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[int], int]:
        """The longest run of seq's leading full blocks found in the cache, and the tokens they hold.

        At most num_tokens - 1 tokens hit, so at least one token is computed and there are logits to sample.
        Ref counts are untouched: pass the blocks to `allocate_slots`, which takes them.
        """
        assert not seq.block_table, "lookup is for a sequence that holds no blocks"
        if not self.enable_prefix_caching:
            return [], 0
        num_lookup_blocks = (seq.num_tokens - 1) // self.block_size
        hashes = self._hashes_of(seq, num_lookup_blocks)
        token_ids = seq.all_token_ids
        hit_blocks: list[int] = []
        for index, block_hash in enumerate(hashes[:num_lookup_blocks]):
            block_id = self._cached.get(block_hash)
            if block_id is None or self.blocks[block_id].token_ids != self._block_tokens(token_ids, index):
                break
            hit_blocks.append(block_id)
        return hit_blocks, len(hit_blocks) * self.block_size

    def cached_but_recomputed(self, seq: Sequence, num_hit: int) -> int:
        """Tokens of seq's final full block when the cache holds all of seq (every lookup block hit, and the
        final block too): the lookup leaves that block out so there is a token to compute, so it is computed
        again (vllm:prompt_tokens_recomputed). 0 otherwise."""
        if not self.enable_prefix_caching or seq.num_tokens % self.block_size != 0:
            return 0
        final = seq.num_tokens // self.block_size - 1
        if final < 0 or num_hit != final * self.block_size:
            return 0
        block_id = self._cached.get(self._hashes_of(seq, final + 1)[final])
        if block_id is None or self.blocks[block_id].token_ids != self._block_tokens(seq.all_token_ids, final):
            return 0
        return self.block_size

    # ----- allocation -----

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None) -> bool:
        """Grow seq.block_table to cover num_computed_tokens + hit tokens + num_new_tokens positions.

        computed_blocks (from get_computed_blocks, for a sequence that holds no blocks) are prepended and
        their ref counts taken. Returns False and changes nothing if the free queue is too short.
        """
        computed = computed_blocks or []
        assert not computed or (not seq.block_table and seq.num_computed_tokens == 0)
        num_tokens = seq.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        num_new_blocks = max(0, cdiv(num_tokens, self.block_size) - len(seq.block_table) - len(computed))
        # Touching a free cached block takes it out of the free queue, so it cannot also be allocated.
        num_revived = sum(1 for block_id in computed if self.blocks[block_id].ref_count == 0)
        if num_new_blocks + num_revived > self.num_free_blocks:
            return False
        for block_id in computed:
            self._touch(block_id)
        if computed:
            self._num_handled_blocks[seq.request_id] = len(computed)
        seq.block_table.extend(computed)
        seq.block_table.extend(self._allocate_block() for _ in range(num_new_blocks))
        return True

    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _allocate_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            self._evict(block)
        block.ref_count = 1
        return block_id

    def _evict(self, block: Block) -> None:
        assert block.block_hash is not None
        del self._cached[block.block_hash]
        self._events.append(BlockRemoved(block_hashes=[to_int64(block.block_hash)]))
        if self.record_evictions:
            self._evicted.append(EvictedBlock(block.block_id, block.block_hash, block.token_ids))
        block.block_hash = None
        block.token_ids = ()

    # ----- caching computed blocks -----

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that became full (computed) since the last call; emit BlockStored for them.

        One BlockStored per contiguous run of newly registered blocks: one per call, unless a block in the
        middle duplicates a hash another block already holds (that block is skipped, not registered twice).
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        first = self._num_handled_blocks.get(seq.request_id, 0)
        if num_full <= first:
            return
        hashes = self._hashes_of(seq, num_full)
        token_ids = seq.all_token_ids
        run: list[int] = []  # indices of a contiguous run of newly registered blocks
        for index in range(first, num_full):
            if self._register(seq.block_table[index], hashes[index], self._block_tokens(token_ids, index)):
                run.append(index)
                continue
            self._emit_stored(run, hashes, token_ids)
            run = []
        self._emit_stored(run, hashes, token_ids)
        self._num_handled_blocks[seq.request_id] = num_full

    def _register(self, block_id: int, block_hash: BlockHash, token_ids: tuple[int, ...]) -> bool:
        """Cache block_id under block_hash; False if it is already cached or another block holds the hash."""
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash = block_hash
        block.token_ids = token_ids
        self._cached[block_hash] = block_id
        return True

    def _emit_stored(self, run: list[int], hashes: list[BlockHash], token_ids: list[int]) -> None:
        if not run:
            return
        first, last = run[0], run[-1]
        self._events.append(
            BlockStored(
                block_hashes=[to_int64(hashes[i]) for i in run],
                parent_block_hash=to_int64(hashes[first - 1]) if first > 0 else None,
                token_ids=token_ids[first * self.block_size : (last + 1) * self.block_size],
                block_size=self.block_size,
            )
        )

    def _hashes_of(self, seq: Sequence, num_blocks: int) -> list[BlockHash]:
        """seq's chained block hashes, extended (never recomputed) to cover at least num_blocks blocks."""
        hashes = self._seq_hashes.setdefault(seq.request_id, [])
        if len(hashes) < num_blocks:
            token_ids = seq.all_token_ids
            parent = hashes[-1] if hashes else None
            for index in range(len(hashes), num_blocks):
                parent = hash_block_tokens(parent, self._block_tokens(token_ids, index), None, self.hash_seed)
                hashes.append(parent)
        return hashes

    def _block_tokens(self, token_ids: list[int], index: int) -> tuple[int, ...]:
        return tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])

    # ----- freeing -----

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks, tail first, so a sequence's tail is evicted before its head."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"double free of block {block_id}"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_table.clear()
        self._seq_hashes.pop(seq.request_id, None)
        self._num_handled_blocks.pop(seq.request_id, None)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Refused (False, nothing changes) while any block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        if not self.enable_prefix_caching:
            return True
        for block in self.blocks:
            block.block_hash = None
            block.token_ids = ()
        self._cached.clear()
        self._events.append(AllBlocksCleared())
        return True

    def take_evicted(self) -> list[EvictedBlock]:
        evicted, self._evicted = self._evicted, []
        return evicted

    def cached_prefix_blocks(self, hashes: list[BlockHash]) -> int:
        """How many leading blocks of `hashes` the cache holds (tokens not checked: a hint for the tier fetch,
        read from another thread; the scheduler's own lookup decides)."""
        count = 0
        for block_hash in hashes:
            if block_hash not in self._cached:
                break
            count += 1
        return count

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events
