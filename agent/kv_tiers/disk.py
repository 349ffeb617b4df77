"""The local-disk tier: one file per block under `root`, within a byte limit, evicted by a segmented LRU.

    root/<layout>/<first 2 hex digits of the hash>/<hash as 16 hex digits>.kvb

Each file is a one-block tier frame (engine.contract.kv_tier): header with the tokens and checksum, then the
payload. A file is written to a temporary name and renamed, so a reader never sees half a block; a write cut
by a crash leaves only a temporary file, removed at the next start. No fsync: a block torn by a power loss
fails its checksum and is recomputed, which is all a cache owes.

Restart. `open()` rebuilds the index from the files, reading and verifying every one (a corrupt or foreign
file is deleted and counted), oldest first by modification time, so the LRU order roughly survives. A block
read later that fails its checksum (the disk changed under us) is deleted and reported as a miss.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.contract.kv_tier import TierBlock, TierFrameError, decode_tier_frame, encode_tier_frame, valid_layout

from agent.kv_tiers.policy import SegmentedLRU

Key = tuple[str, int]
SUFFIX = ".kvb"
TMP_SUFFIX = ".tmp"


@dataclass
class RebuildReport:
    blocks: int = 0
    bytes: int = 0
    corrupt: int = 0  # files that failed to parse or verify, deleted
    stale: int = 0  # temporary files of writes cut short, deleted


class DiskTier:
    name = "disk"

    def __init__(self, root: Path, capacity_bytes: int):
        self.root = Path(root)
        self._policy = SegmentedLRU(capacity_bytes)
        self.corrupt = 0  # blocks found corrupt since open (rebuild and reads)

    @property
    def capacity_bytes(self) -> int:
        return self._policy.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self._policy.used_bytes

    def __len__(self) -> int:
        return len(self._policy)

    def __contains__(self, key: Key) -> bool:
        return key in self._policy

    def path_of(self, key: Key) -> Path:
        layout, block_hash = key
        name = f"{block_hash:016x}"
        return self.root / layout / name[:2] / (name + SUFFIX)

    def open(self) -> RebuildReport:
        """Rebuild the index from the files under root (see the module doc); blocks over the capacity are
        evicted, oldest first."""
        report = RebuildReport()
        self.root.mkdir(parents=True, exist_ok=True)
        found: list[tuple[float, Key, int]] = []
        for path in self.root.rglob("*"):
            if not path.is_file():
                continue
            if path.suffix == TMP_SUFFIX:
                path.unlink(missing_ok=True)
                report.stale += 1
                continue
            block = self._read(path)
            if block is None or self.path_of(block.key) != path:
                path.unlink(missing_ok=True)
                report.corrupt += 1
                continue
            found.append((path.stat().st_mtime, block.key, block.nbytes))
        for _, key, nbytes in sorted(found):
            for evicted in self._policy.admit(key, nbytes):
                self.path_of(evicted).unlink(missing_ok=True)
        report.blocks, report.bytes = len(self._policy), self._policy.used_bytes
        self.corrupt += report.corrupt
        return report

    def put(self, block: TierBlock) -> list[Key]:
        """Write `block`; the keys evicted to make room (their files are gone)."""
        if not valid_layout(block.layout):
            raise ValueError(f"not a layout: {block.layout!r}")
        if block.key in self._policy:
            self._policy.touch(block.key)
            return []
        evicted = self._policy.admit(block.key, block.nbytes)
        if block.key in evicted:
            return evicted  # larger than the tier: not written
        path = self.path_of(block.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(TMP_SUFFIX)
        tmp.write_bytes(encode_tier_frame(block.layout, [block]))
        os.replace(tmp, path)
        for key in evicted:
            self.path_of(key).unlink(missing_ok=True)
        return evicted

    def resize(self, capacity_bytes: int) -> list[Key]:
        evicted = self._policy.resize(capacity_bytes)
        for key in evicted:
            self.path_of(key).unlink(missing_ok=True)
        return evicted

    def get(self, key: Key) -> TierBlock | None:
        """The block, verified; None if the tier does not hold it or it failed its checksum (then deleted)."""
        if key not in self._policy:
            return None
        block = self._read(self.path_of(key))
        if block is None or block.key != key:
            self.remove(key)
            self.corrupt += 1
            return None
        self._policy.touch(key)
        return block

    def remove(self, key: Key) -> bool:
        held = self._policy.discard(key)
        self.path_of(key).unlink(missing_ok=True)
        return held

    def clear(self) -> list[Key]:
        keys = self._policy.clear()
        for key in keys:
            self.path_of(key).unlink(missing_ok=True)
        return keys

    def keys(self) -> list[Key]:
        return list(self._policy)

    @staticmethod
    def _read(path: Path) -> TierBlock | None:
        try:
            _, blocks = decode_tier_frame(path.read_bytes(), max_blocks=1)
        except (OSError, TierFrameError):
            return None
        return blocks[0] if len(blocks) == 1 else None
