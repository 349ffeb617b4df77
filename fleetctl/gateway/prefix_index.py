"""The gateway's global prefix index: which engines hold which KV blocks, fed by the engines' KV events.

Keys are block hashes as events carry them: the low 64 bits of vLLM's `sha256_cbor` chained hash
(`engine.hashing.block_hashes_int64` computes the same numbers for a request's prompt). Because hashes are
chained, block i of a prompt can only be reused on an engine that also holds blocks 0..i-1, so the one
question the router asks is `longest_prefix`: how many LEADING blocks of this request each engine holds.

Invariants and choices:
- Per engine, a block is held while at least one medium ("GPU", "CPU" for offloaded blocks, ...) holds
  it: `BlockRemoved(medium="GPU")` of a block that was also offloaded to "CPU" keeps it indexed.
  A missing medium counts as "GPU", vLLM's default.
- `AllBlocksCleared` from an engine removes only what that engine's own memory held: the engine reset its
  prefix cache, not its node's tiers, whose blocks it still reaches (and whose events it still relays).
- Bounded memory: each engine holds at most `max_blocks_per_engine` hashes (default 131,072: more blocks
  than an 80 GB GPU holds for an 8B model at 16 tokens a block). Past the cap the least recently used
  hash of that engine is forgotten. "Used" means stored, or `touch`ed by the gateway when it routes a
  request there (the engine re-uses the blocks then, but emits no event for a hit). An entry costs about
  250 bytes, so the default bound is ~32 MiB per engine.
- The index tracks the last applied sequence number per engine; `apply_batch` refuses a batch that would
  leave a gap (the subscriber then asks the engine's replay socket for the missing batches) and ignores
  one it has already applied (the overlap between a replay and the live stream).
- Forgetting is safer than remembering wrongly only in part: a stale "held" entry self-corrects (the engine
  recomputes the block and stores it again), a forgotten one silently costs locality. So an unrecoverable
  gap keeps what the index has (`allow_gap=True`) rather than clearing the engine.

Where a block is held matters to the price of a hit: `prefix_hits` splits an engine's leading run into the
blocks its own memory holds ("GPU") and, after the first one it does not, the blocks only a node tier holds
("CPU", the node's DRAM; "STORAGE", its disk; other names are folded as Dynamo's router folds them, see
`tier_of`). That is how an engine uses them: its prefix cache takes the leading run in memory, then fetches the
run that follows from the tier; the first block in neither ends what it can reuse.

Plain data, no I/O, no clock: the live gateway and the simulator share it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent

EngineId = str
DEFAULT_MAX_BLOCKS_PER_ENGINE = 131_072
DEFAULT_MEDIUM = "GPU"
TIER_MEDIA = ("CPU", "STORAGE", "EXTERNAL")  # cheapest first: the tier a block is fetched from when several hold it
_MEDIUM_ALIASES = {"DEVICE": "GPU", "CPU_PINNED": "CPU", "CPU_TIER1": "CPU", "CPU_TIER2": "STORAGE",
                   "DISK": "STORAGE", "NVME": "STORAGE", "NETWORK": "EXTERNAL", "REMOTE": "EXTERNAL",
                   "SHARED": "EXTERNAL", "SHARED_STORAGE": "EXTERNAL"}


def tier_of(medium: str) -> str:
    """A medium name as one of GPU, CPU, STORAGE, EXTERNAL (Dynamo kv-router's StorageTier::from_kv_medium
    aliases; an unknown name is taken as EXTERNAL, the dearest: better to under-price a hit than to count on it)."""
    name = medium.upper()
    if name in ("GPU", *TIER_MEDIA):
        return name
    return _MEDIUM_ALIASES.get(name, "EXTERNAL")


@dataclass(frozen=True)
class PrefixHit:
    """An engine's leading run of a request's blocks, by where the engine will find them."""

    memory_blocks: int = 0  # the leading blocks its own memory holds
    tier_blocks: tuple[tuple[str, int], ...] = ()  # then, (medium, blocks) of the run only a node tier holds

    @property
    def blocks(self) -> int:
        return self.memory_blocks + sum(n for _, n in self.tier_blocks)

    def with_memory(self, blocks: int) -> PrefixHit:
        """This hit when memory is known to hold at least `blocks` leading blocks (a prefix routed there and still
        in flight). The tier blocks it covers are taken from the cheapest tier first: what is left is priced at
        its dearest."""
        if blocks <= self.memory_blocks:
            return self
        if blocks >= self.blocks:
            return PrefixHit(blocks)
        covered, left = blocks - self.memory_blocks, []
        for medium, count in self.tier_blocks:
            taken = min(count, covered)
            covered -= taken
            if count > taken:
                left.append((medium, count - taken))
        return PrefixHit(blocks, tuple(left))


class SeqCheck(Enum):
    """What `apply_batch` did with a batch, judged by its sequence number."""

    APPLIED = "applied"  # the next expected batch (or the first one seen): applied
    DUPLICATE = "duplicate"  # at or before the last applied one: ignored
    GAP = "gap"  # later than the next expected one: NOT applied; replay from `next_seq` first


@dataclass
class IndexStats:
    """Counters for metrics and tests."""

    batches_applied: int = 0
    duplicates_ignored: int = 0
    gaps_detected: int = 0
    gaps_accepted: int = 0  # gaps replay could not fill (the engine's replay buffer had rolled over)
    evictions: int = 0  # hashes forgotten by the per-engine LRU cap


class PrefixIndex:
    """block hash -> engines holding it, per-engine LRU-bounded."""

    def __init__(self, max_blocks_per_engine: int = DEFAULT_MAX_BLOCKS_PER_ENGINE) -> None:
        if max_blocks_per_engine <= 0:
            raise ValueError("max_blocks_per_engine must be positive")
        self.max_blocks_per_engine = max_blocks_per_engine
        self.stats = IndexStats()
        self._holders: dict[int, set[EngineId]] = {}
        # per engine: hash -> media holding it, ordered least recently used first
        self._blocks: dict[EngineId, OrderedDict[int, set[str]]] = {}
        self._last_seq: dict[EngineId, int] = {}

    # --- queries ---

    def engines(self) -> list[EngineId]:
        return sorted(self._blocks)

    def num_blocks(self, engine: EngineId) -> int:
        return len(self._blocks.get(engine, ()))

    def holds(self, engine: EngineId, block_hash: int) -> bool:
        return block_hash in self._blocks.get(engine, {})

    def last_seq(self, engine: EngineId) -> int | None:
        return self._last_seq.get(engine)

    def next_seq(self, engine: EngineId) -> int:
        """The sequence number the engine's next batch should carry (0 when none was seen)."""
        last = self._last_seq.get(engine)
        return 0 if last is None else last + 1

    def longest_prefix(
        self, block_hashes: Sequence[int], engine_ids: Iterable[EngineId] | None = None
    ) -> dict[EngineId, int]:
        """For each engine (default: every engine the index knows), how many leading blocks it holds."""
        candidates = set(self._blocks if engine_ids is None else engine_ids)
        matched: dict[EngineId, int] = {}
        for position, block_hash in enumerate(block_hashes):
            holders = self._holders.get(block_hash, set())
            for engine in candidates - holders:
                matched[engine] = position
            candidates &= holders
            if not candidates:
                break
        for engine in candidates:
            matched[engine] = len(block_hashes)
        return matched

    def prefix_hits(self, block_hashes: Sequence[int], engine_ids: Iterable[EngineId]) -> dict[EngineId, PrefixHit]:
        """For each engine with a hit: its leading run split into memory blocks and then tier blocks (module doc)."""
        hits = {}
        for engine, run in self.longest_prefix(block_hashes, engine_ids).items():
            if run:
                hits[engine] = self._split_run(self._blocks[engine], block_hashes[:run])
        return hits

    def node_tier_run(self, block_hashes: Sequence[int], engine: EngineId) -> int:
        """How many leading blocks the engine's node tier holds (DRAM or disk): what a peer can fetch from it."""
        blocks = self._blocks.get(engine, {})
        run = 0
        for block_hash in block_hashes:
            media = blocks.get(block_hash)
            if media is None or not {tier_of(m) for m in media} & {"CPU", "STORAGE"}:
                break
            run += 1
        return run

    @staticmethod
    def _split_run(blocks: OrderedDict[int, set[str]], run: Sequence[int]) -> PrefixHit:
        memory = 0
        while memory < len(run) and "GPU" in {tier_of(m) for m in blocks[run[memory]]}:
            memory += 1
        counts: dict[str, int] = {}
        for block_hash in run[memory:]:
            tiers = {tier_of(m) for m in blocks[block_hash]}
            cheapest = next((t for t in TIER_MEDIA if t in tiers), None)
            if cheapest is None:
                break  # held only in engine memory after a gap: the engine cannot reach it
            counts[cheapest] = counts.get(cheapest, 0) + 1
        return PrefixHit(memory, tuple((t, counts[t]) for t in TIER_MEDIA if t in counts))

    # --- updates ---

    def apply_batch(
        self, engine: EngineId, seq: int, batch: EventBatch, *, allow_gap: bool = False
    ) -> SeqCheck:
        """Apply an engine's batch if its sequence number is the next one (or the first one seen)."""
        last = self._last_seq.get(engine)
        if last is not None and seq <= last:
            self.stats.duplicates_ignored += 1
            return SeqCheck.DUPLICATE
        if last is not None and seq > last + 1:
            if not allow_gap:
                self.stats.gaps_detected += 1
                return SeqCheck.GAP
            self.stats.gaps_accepted += 1
        self._blocks.setdefault(engine, OrderedDict())
        for event in batch.events:
            self.apply_event(engine, event)
        self._last_seq[engine] = seq
        self.stats.batches_applied += 1
        return SeqCheck.APPLIED

    def apply_event(self, engine: EngineId, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            self._store(engine, event.block_hashes, event.medium or DEFAULT_MEDIUM)
        elif isinstance(event, BlockRemoved):
            self._remove(engine, event.block_hashes, event.medium or DEFAULT_MEDIUM)
        elif isinstance(event, AllBlocksCleared):
            self._clear_memory(engine)

    def touch(self, engine: EngineId, block_hashes: Iterable[int]) -> None:
        """Mark blocks as recently used on an engine (the gateway routed a request that re-uses them)."""
        blocks = self._blocks.get(engine)
        if blocks is None:
            return
        for block_hash in block_hashes:
            if block_hash in blocks:
                blocks.move_to_end(block_hash)

    def reset_engine(self, engine: EngineId) -> None:
        """Forget an engine's blocks and sequence number but keep it known (its publisher restarted)."""
        self._clear(engine)
        self._last_seq.pop(engine, None)

    def drop_engine(self, engine: EngineId) -> None:
        """Forget an engine entirely (it left the routing table)."""
        self._clear(engine)
        self._blocks.pop(engine, None)
        self._last_seq.pop(engine, None)

    # --- internals ---

    def _store(self, engine: EngineId, block_hashes: Iterable[int], medium: str) -> None:
        blocks = self._blocks.setdefault(engine, OrderedDict())
        for block_hash in block_hashes:
            blocks.setdefault(block_hash, set()).add(medium)
            blocks.move_to_end(block_hash)
            self._holders.setdefault(block_hash, set()).add(engine)
        while len(blocks) > self.max_blocks_per_engine:
            evicted, _ = blocks.popitem(last=False)
            self._forget_holder(evicted, engine)
            self.stats.evictions += 1

    def _remove(self, engine: EngineId, block_hashes: Iterable[int], medium: str) -> None:
        blocks = self._blocks.get(engine)
        if blocks is None:
            return
        for block_hash in block_hashes:
            media = blocks.get(block_hash)
            if media is None:
                continue  # never seen, or already evicted by the cap
            media.discard(medium)
            if not media:
                del blocks[block_hash]
                self._forget_holder(block_hash, engine)

    def _clear_memory(self, engine: EngineId) -> None:
        blocks = self._blocks.get(engine)
        if blocks is None:
            return
        for block_hash, media in list(blocks.items()):
            media -= {m for m in media if tier_of(m) == "GPU"}
            if not media:
                del blocks[block_hash]
                self._forget_holder(block_hash, engine)

    def _clear(self, engine: EngineId) -> None:
        blocks = self._blocks.get(engine)
        if blocks is None:
            return
        for block_hash in blocks:
            self._forget_holder(block_hash, engine)
        blocks.clear()

    def _forget_holder(self, block_hash: int, engine: EngineId) -> None:
        holders = self._holders.get(block_hash)
        if holders is None:
            return
        holders.discard(engine)
        if not holders:
            del self._holders[block_hash]
