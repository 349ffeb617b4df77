"""Which block a full tier gives up: a segmented LRU (LRU with a frequency term), over sizes in bytes.

A block enters *probation*. A hit there moves it to *protected*; protected holds at most `protected_share` of
the capacity, and what it pushes out falls back to the most recent end of probation (one more chance). The
victim is always the least recent block of probation, else of protected. So a run of blocks used once (a
long one-off prompt) churns through probation and cannot flush the blocks that are hit again and again (a
shared system prompt, an active conversation), which is what a tier is for; and a block that stops being hit
ages out like in plain LRU. Every operation is O(1) amortised (two ordered dicts).

Plain bookkeeping over keys and sizes: the tiers (dram.py, disk.py) keep the bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator


class SegmentedLRU:
    def __init__(self, capacity_bytes: int, protected_share: float = 0.8):
        if capacity_bytes < 0 or not 0.0 <= protected_share < 1.0:
            raise ValueError("capacity must be >= 0 and protected_share in [0, 1)")
        self.capacity_bytes = capacity_bytes
        self._protected_share = protected_share
        self.protected_limit = int(capacity_bytes * protected_share)
        self._probation: OrderedDict[Hashable, int] = OrderedDict()  # least recent first
        self._protected: OrderedDict[Hashable, int] = OrderedDict()
        self._protected_bytes = 0
        self.used_bytes = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._probation or key in self._protected

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def __iter__(self) -> Iterator[Hashable]:
        """Every key, the next victim first."""
        yield from list(self._probation)
        yield from list(self._protected)

    def admit(self, key: Hashable, size: int) -> list[Hashable]:
        """Take `key` (into probation; an existing key is touched instead) and return the keys evicted to make
        room, oldest first. A block larger than the whole tier is not taken: it is returned as evicted."""
        if key in self:
            self.touch(key)
            return []
        if size > self.capacity_bytes:
            return [key]
        self._probation[key] = size
        self.used_bytes += size
        return self._evict_over_capacity(keep=key)

    def touch(self, key: Hashable) -> None:
        """A hit: a probation key is promoted to protected, a protected one becomes the most recent there."""
        if key in self._protected:
            self._protected.move_to_end(key)
            return
        size = self._probation.pop(key)
        self._protected[key] = size
        self._protected_bytes += size
        while self._protected_bytes > self.protected_limit and len(self._protected) > 1:
            demoted, demoted_size = self._protected.popitem(last=False)
            self._protected_bytes -= demoted_size
            self._probation[demoted] = demoted_size  # most recent end of probation: one more chance

    def resize(self, capacity_bytes: int) -> list[Hashable]:
        """A new capacity; the keys evicted to fit it, next victim first."""
        self.capacity_bytes = capacity_bytes
        self.protected_limit = int(capacity_bytes * self._protected_share)
        evicted = []
        while self.used_bytes > self.capacity_bytes:
            victim = next(iter(self))
            self.discard(victim)
            evicted.append(victim)
        return evicted

    def discard(self, key: Hashable) -> bool:
        for segment in (self._probation, self._protected):
            if key in segment:
                size = segment.pop(key)
                self.used_bytes -= size
                if segment is self._protected:
                    self._protected_bytes -= size
                return True
        return False

    def clear(self) -> list[Hashable]:
        keys = list(self)
        self._probation.clear()
        self._protected.clear()
        self._protected_bytes = self.used_bytes = 0
        return keys

    def _evict_over_capacity(self, keep: Hashable) -> list[Hashable]:
        evicted = []
        while self.used_bytes > self.capacity_bytes:
            victim = self._victim(keep)
            self.discard(victim)
            evicted.append(victim)
        return evicted

    def _victim(self, keep: Hashable) -> Hashable:
        for segment in (self._probation, self._protected):
            for key in segment:
                if key != keep:
                    return key
        raise AssertionError("over capacity with only the admitted key, which fits")  # admit checked its size
