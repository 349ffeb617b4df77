"""The node's tier stores, one per replica class that asks for tiers (its `kv_tiers` field).

A class's engines on this node share one store (a block is found by its KV layout and hash, so revisions of the
class whose KV is the same share blocks, and ones whose KV differs never meet). The store is made when the first
engine of the class is launched, its disk directory `ROOT/<class name>` (or the class's `disk_path`) rebuilt
then; a later revision that asks for other sizes resizes it. Stores outlive their engines: a restarted engine
warms from what its class left.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.kv_tiers.store import TierStore

log = logging.getLogger("fleetctl.agent.kv_tiers")
MIB = 1 << 20


def tier_sizes(kv_tiers: Mapping[str, Any] | None) -> tuple[int, int]:
    """(dram bytes, disk bytes) a class's kv_tiers asks for."""
    if not kv_tiers:
        return 0, 0
    return int(kv_tiers.get("dram_mib") or 0) * MIB, int(kv_tiers.get("disk_mib") or 0) * MIB


class TierRegistry:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.disk_enabled = True  # the fleet flag kv_tier_disk
        self._stores: dict[str, TierStore] = {}
        self._lock = threading.Lock()

    def ensure(self, class_name: str, kv_tiers: Mapping[str, Any] | None) -> TierStore | None:
        """The class's store, made (its disk index rebuilt) or resized to what `kv_tiers` asks; None when it asks
        for no tier."""
        dram, disk = tier_sizes(kv_tiers)
        if dram <= 0 and disk <= 0:
            return None
        with self._lock:
            store = self._stores.get(class_name)
            if store is None:
                path = Path((kv_tiers or {}).get("disk_path") or self.root / class_name)
                store = TierStore(dram, path if disk > 0 else None, disk)
                report = store.open()
                store.set_disk_enabled(self.disk_enabled)
                self._stores[class_name] = store
                if report is not None:
                    log.info("KV tier of %s: disk %s holds %d blocks (%d corrupt, %d stale files removed)",
                             class_name, path, report.blocks, report.corrupt, report.stale)
            else:
                store.resize(dram, disk)
            return store

    def get(self, class_name: str) -> TierStore | None:
        with self._lock:
            return self._stores.get(class_name)

    def items(self) -> list[tuple[str, TierStore]]:
        with self._lock:
            return sorted(self._stores.items())

    def set_disk_enabled(self, enabled: bool) -> None:
        with self._lock:
            self.disk_enabled = enabled
            for store in self._stores.values():
                store.set_disk_enabled(enabled)

    def flush(self, class_name: str | None = None, tier: str | None = None) -> dict[str, int]:
        """Drop the blocks of one class's tiers (None: every class's), of one tier (None: both). Returns the
        blocks dropped per class; a class with no store here drops nothing."""
        stores = self.items() if class_name is None else [(class_name, self.get(class_name))]
        return {name: sum(store.flush(tier).values()) for name, store in stores if store is not None}

    def reports(self) -> list[dict[str, Any]]:
        """Every class's tiers, one row each, in engine.contract.kv_tier_report.TierReport's shape (the
        heartbeat sends them; GET /kv/status shows them)."""
        rows = []
        for class_name, store in self.items():
            for status in store.status():
                rows.append({"class_name": class_name, **asdict(status), "offloaded": store.counters.offloaded,
                             "refused": store.counters.refused})
        return rows
