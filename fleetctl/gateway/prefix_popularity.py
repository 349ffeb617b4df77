"""How many recent requests began with each prefix, for the scorer's price of a miss on a shared prefix.

A prompt's block hashes are chained (each hashes its parent's hash with its own tokens), so one hash names
a whole prefix: the count of a hash is the number of recent requests whose prompt began with that prefix,
and counts never rise along a prompt's chain. A long system prompt that every tenant request repeats counts
tens; a multi-turn session's history counts its own earlier turns only.

Counts decay like the traffic shares (traffic.py): each recorded request adds 1 to every block of its
prompt, and every count halves with every `half_life_requests` requests recorded. The table keeps the
`max_entries` most recently seen prefixes; a forgotten prefix counts 0, which only prices its miss fully.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass
class PrefixPopularity:
    half_life_requests: float = 64.0
    max_entries: int = 200_000
    _half_lives: float = 0.0
    _counts: OrderedDict[Hashable, tuple[float, float]] = field(default_factory=OrderedDict)  # prefix -> (count, at)

    def _decayed(self, prefix: Hashable) -> float:
        count, at = self._counts.get(prefix, (0.0, self._half_lives))
        return count * math.exp2(-(self._half_lives - at))

    def counts(self, prefixes: Sequence[Hashable]) -> tuple[float, ...]:
        """Recent requests that began with each prefix of a prompt (its block hashes, in order)."""
        return tuple(self._decayed(p) for p in prefixes)

    def record(self, prefixes: Sequence[Hashable]) -> None:
        """One request with these prefixes was routed."""
        self._half_lives += 1.0 / self.half_life_requests
        for prefix in prefixes:
            self._counts[prefix] = (self._decayed(prefix) + 1.0, self._half_lives)
            self._counts.move_to_end(prefix)
        while len(self._counts) > self.max_entries:
            self._counts.popitem(last=False)

    def __len__(self) -> int:
        return len(self._counts)
