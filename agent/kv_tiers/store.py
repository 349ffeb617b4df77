"""A node's KV tiers as one store: engine offloads land in DRAM, DRAM's evictions go to disk, a fetch takes
the leading run of a prompt's blocks from whichever tier holds each (a disk hit is promoted back to DRAM).

Shared by the node's engines: blocks are keyed by (layout, hash) (engine.contract.kv_tier), so engines of one
model and class share them and a differently configured class never sees them. A fetch compares every
block's tokens with the ones asked for, as the engine's own cache does; a block whose tokens differ ends the
run, as a miss. Every call is serialised by one lock: the tiers are plain dicts and files, and the agent's API
calls the store from worker threads (disk I/O stays off its event loop).

The disk tier can be switched off at run time (the fleet flag `kv_tier_disk`): then DRAM's evictions are
dropped, and fetches do not read disk; what disk holds stays there for when it is switched on again.

Events. Every change of what a tier holds is a KV event in vLLM's vocabulary (`BlockStored`/`BlockRemoved`
with medium "CPU" for DRAM, "STORAGE" for disk), numbered in one sequence per store and kept in a bounded log.
The node's engines read it with `events_since(layout, after)` and publish the events of their own layout on
their KV event streams, as vLLM's offloading connector does, so the gateway's index learns which engines can
reach a block in a tier. A reader whose number fell out of the log (or is newer than the log: the agent
restarted) gets a snapshot instead: every block of its layout with its tiers, to diff against what it
announced.

Counters and gauges per tier (`status`): bytes and blocks held, capacity, hits and misses (blocks), fetch
seconds (sum and count, per tier that answered), blocks offloaded, offloads refused (a block larger than
DRAM) and corrupt blocks found. The engine counts the offloads it dropped because the tier could not keep up;
those never reach the store.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.contract.kv_tier import TIER_MEDIA, TierBlock
from engine.kv_events import BlockRemoved, BlockStored, KVEvent

from agent.kv_tiers.disk import DiskTier, RebuildReport
from agent.kv_tiers.dram import DramTier

Key = tuple[str, int]
TIER_NAMES = ("dram", "disk")
EVENT_LOG_SIZE = 16_384  # events kept for readers; one who falls further behind gets a snapshot


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0
    fetch_seconds: float = 0.0
    fetches: int = 0  # fetch calls this tier answered at least one block of


@dataclass(frozen=True)
class TierStatus:
    tier: str
    medium: str
    enabled: bool
    capacity_bytes: int
    used_bytes: int
    blocks: int
    hits: int
    misses: int
    fetch_seconds_sum: float
    fetches: int
    corrupt: int = 0

    @property
    def hit_rate(self) -> float | None:
        looked = self.hits + self.misses
        return self.hits / looked if looked else None

    @property
    def mean_fetch_s(self) -> float | None:
        return self.fetch_seconds_sum / self.fetches if self.fetches else None


@dataclass(frozen=True)
class FetchResult:
    blocks: list[TierBlock]  # the leading run found, in the order asked
    media: list[str]  # where each came from: "dram" | "disk"
    token_mismatches: int = 0


@dataclass(frozen=True)
class TierEvent:
    """A KV event of the tier, numbered, with the layout it is about (events themselves carry no layout)."""

    seq: int
    layout: str
    event: KVEvent


@dataclass(frozen=True)
class TierEventPage:
    """What `events_since` answers: the layout's events after the reader's number, or a snapshot."""

    seq: int  # the store's latest event number: the reader's `after` next time
    events: list[KVEvent]  # in order; empty when `snapshot` is given
    snapshot: dict[int, list[str]] | None = None  # block hash -> media holding it, every block of the layout


@dataclass
class StoreCounters:
    offloaded: int = 0
    refused: int = 0  # taken by no tier (larger than DRAM, and no disk tier that holds it)
    token_mismatches: int = 0
    per_tier: dict[str, TierCounters] = field(default_factory=lambda: {name: TierCounters() for name in TIER_NAMES})


class TierStore:
    def __init__(self, dram_bytes: int, disk_root: Path | None = None, disk_bytes: int = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.dram = DramTier(dram_bytes)
        self.disk = DiskTier(disk_root, disk_bytes) if disk_root is not None and disk_bytes > 0 else None
        self.disk_enabled = self.disk is not None
        self.counters = StoreCounters()
        self._clock = clock
        self._lock = threading.Lock()
        self._events: deque[TierEvent] = deque(maxlen=EVENT_LOG_SIZE)
        self._event_seq = 0

    def open(self) -> RebuildReport | None:
        """Rebuild the disk tier's index from its files (None: no disk tier)."""
        if self.disk is None:
            return None
        with self._lock:
            report = self.disk.open()
            for layout, block_hash in self.disk.keys():
                self._stored(layout, block_hash, "disk")
            return report

    def resize(self, dram_bytes: int, disk_bytes: int) -> None:
        """New limits (a class revision asked for other sizes); what no longer fits is evicted (DRAM's demoted)."""
        with self._lock:
            for old in self.dram.resize(dram_bytes):
                self._removed(old.layout, old.block_hash, "dram")
                self._demote(old)
            if self.disk is not None:
                for layout, block_hash in self.disk.resize(disk_bytes):
                    self._removed(layout, block_hash, "disk")

    def set_disk_enabled(self, enabled: bool) -> None:
        """Turn the disk tier off or on; its blocks leave (or come back to) the routers' view with it."""
        with self._lock:
            enabled = enabled and self.disk is not None
            if enabled == self.disk_enabled:
                return
            self.disk_enabled = True  # so that the events below are recorded either way
            for layout, block_hash in self.disk.keys() if self.disk is not None else []:
                (self._stored if enabled else self._removed)(layout, block_hash, "disk")
            self.disk_enabled = enabled

    # --- offload ---

    def offload(self, blocks: Sequence[TierBlock]) -> int:
        """Hold the blocks in DRAM (demoting what that evicts to disk; a block DRAM cannot hold at all, as with
        a disk-only class, goes straight to disk); how many were taken."""
        taken = 0
        with self._lock:
            for block in blocks:
                if self._put_dram(block) or self._demote(block):
                    taken += 1
                else:
                    self.counters.refused += 1
            self.counters.offloaded += taken
        return taken

    def _put_dram(self, block: TierBlock) -> bool:
        """Hold `block` in DRAM, demoting what that evicts; False if it is larger than the whole tier."""
        fresh = block.key not in self.dram
        evicted = self.dram.put(block)
        taken = all(old.key != block.key for old in evicted)
        if taken and fresh:
            self._stored(block.layout, block.block_hash, "dram")
        for old in evicted:
            if old.key != block.key:
                self._removed(old.layout, old.block_hash, "dram")
                self._demote(old)
        return taken

    def _demote(self, block: TierBlock) -> bool:
        """Write `block` to disk (DRAM evicted it, or could not hold it); False if disk did not take it."""
        if self.disk is None or not self.disk_enabled:
            return False
        fresh = block.key not in self.disk
        evicted = self.disk.put(block)
        for layout, block_hash in evicted:
            if (layout, block_hash) != block.key:
                self._removed(layout, block_hash, "disk")
        if fresh and block.key in self.disk:
            self._stored(block.layout, block.block_hash, "disk")
        return block.key in self.disk

    # --- fetch ---

    def fetch(self, layout: str, hashes: Sequence[int], token_ids: Sequence[Sequence[int]]) -> FetchResult:
        """The leading run of `hashes` the tiers hold with the same tokens, DRAM first, then disk (a disk hit is
        promoted to DRAM). The first block not found, or found with other tokens, ends the run."""
        if len(hashes) != len(token_ids):
            raise ValueError("one token list per block hash")
        blocks: list[TierBlock] = []
        media: list[str] = []
        mismatches = 0
        with self._lock:
            for block_hash, tokens in zip(hashes, token_ids):
                found = self._find((layout, block_hash))
                if found is None:
                    break
                block, tier, seconds = found
                if block.token_ids != tuple(tokens):
                    mismatches += 1
                    self.counters.token_mismatches += 1
                    break
                self._count_hit(tier, seconds)
                blocks.append(block)
                media.append(tier)
            self._count_miss(len(hashes) - len(blocks))
        return FetchResult(blocks, media, mismatches)

    def _find(self, key: Key) -> tuple[TierBlock, str, float] | None:
        start = self._clock()
        block = self.dram.get(key)
        if block is not None:
            return block, "dram", self._clock() - start
        if self.disk is None or not self.disk_enabled:
            return None
        held = key in self.disk
        block = self.disk.get(key)
        if block is None:
            if held:  # it failed its checksum and was deleted
                self._removed(key[0], key[1], "disk")
            return None
        seconds = self._clock() - start
        self._put_dram(block)  # promoted; DRAM's victims go down to disk, where they usually already are
        return block, "disk", seconds

    def _count_hit(self, tier: str, seconds: float) -> None:
        counters = self.counters.per_tier[tier]
        counters.hits += 1
        counters.fetch_seconds += seconds
        counters.fetches += 1

    def _count_miss(self, blocks: int) -> None:
        if blocks <= 0:
            return
        self.counters.per_tier["dram"].misses += blocks
        if self.disk is not None and self.disk_enabled:
            self.counters.per_tier["disk"].misses += blocks

    def holds(self, layout: str, hashes: Sequence[int]) -> list[str]:
        """Where each block of the leading run held is (no hit counted, tokens not checked): for routing."""
        media = []
        with self._lock:
            for block_hash in hashes:
                key = (layout, block_hash)
                if key in self.dram:
                    media.append("dram")
                elif self.disk is not None and self.disk_enabled and key in self.disk:
                    media.append("disk")
                else:
                    break
        return media

    # --- operator ---

    def flush(self, tier: str | None = None) -> dict[str, int]:
        """Drop every block of `tier` (None: both); blocks dropped per tier."""
        dropped = {}
        with self._lock:
            if tier in (None, "dram"):
                keys = self.dram.clear()
                for layout, block_hash in keys:
                    self._removed(layout, block_hash, "dram")
                dropped["dram"] = len(keys)
            if tier in (None, "disk") and self.disk is not None:
                keys = self.disk.clear()
                for layout, block_hash in keys:
                    self._removed(layout, block_hash, "disk")
                dropped["disk"] = len(keys)
        return dropped

    def status(self) -> list[TierStatus]:
        with self._lock:
            rows = [self._row("dram", True, self.dram.capacity_bytes, self.dram.used_bytes, len(self.dram), 0)]
            if self.disk is not None:
                rows.append(self._row("disk", self.disk_enabled, self.disk.capacity_bytes, self.disk.used_bytes,
                                      len(self.disk), self.disk.corrupt))
        return rows

    def _row(self, tier: str, enabled: bool, capacity: int, used: int, blocks: int, corrupt: int) -> TierStatus:
        c = self.counters.per_tier[tier]
        return TierStatus(tier, TIER_MEDIA[tier], enabled, capacity, used, blocks, c.hits, c.misses,
                          c.fetch_seconds, c.fetches, corrupt)

    # --- events ---

    def events_since(self, layout: str, after: int) -> TierEventPage:
        """The layout's events numbered after `after` (see the module doc; -1: a snapshot, for a new reader)."""
        with self._lock:
            oldest = self._events[0].seq if self._events else self._event_seq + 1
            if after < oldest - 1 or after > self._event_seq:
                return TierEventPage(self._event_seq, [], self._snapshot(layout))
            start = after - oldest + 1  # numbers are consecutive in the log
            events = [e.event for e in itertools.islice(self._events, start, None) if e.layout == layout]
            return TierEventPage(self._event_seq, events)

    def _snapshot(self, layout: str) -> dict[int, list[str]]:
        held: dict[int, list[str]] = {}
        for key_layout, block_hash in self.dram.keys():
            if key_layout == layout:
                held.setdefault(block_hash, []).append(TIER_MEDIA["dram"])
        if self.disk is not None and self.disk_enabled:
            for key_layout, block_hash in self.disk.keys():
                if key_layout == layout:
                    held.setdefault(block_hash, []).append(TIER_MEDIA["disk"])
        return held

    def _log(self, layout: str, event: KVEvent) -> None:
        self._event_seq += 1
        self._events.append(TierEvent(self._event_seq, layout, event))

    def _stored(self, layout: str, block_hash: int, tier: str) -> None:
        if tier == "disk" and not self.disk_enabled:
            return  # out of the routers' view while the disk tier is off
        self._log(layout, BlockStored(block_hashes=[block_hash], parent_block_hash=None, token_ids=[], block_size=0,
                                      medium=TIER_MEDIA[tier]))

    def _removed(self, layout: str, block_hash: int, tier: str) -> None:
        if tier == "disk" and not self.disk_enabled:
            return
        self._log(layout, BlockRemoved(block_hashes=[block_hash], medium=TIER_MEDIA[tier]))
