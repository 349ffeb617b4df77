"""Recent traffic the gateway itself routed: shares per engine (for the scorer's hot-spot guard) and sessions
(x-session-id -> the engine it last used). Both react the instant a request is routed, between scrapes.

Shares are exponentially decayed counts: each routed request adds 1 to its engine, and every count halves
every `half_life_s`. An engine's share among a set of candidates is its count over their sum (a uniform
share when none of them has recent traffic).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class ShareTracker:
    half_life_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _counts: dict[str, tuple[float, float]] = field(default_factory=dict)  # engine -> (count, at)

    def _decayed(self, engine: str, now: float) -> float:
        count, at = self._counts.get(engine, (0.0, now))
        return count * math.exp2(-(now - at) / self.half_life_s)

    def record(self, engine: str) -> None:
        now = self.clock()
        self._counts[engine] = (self._decayed(engine, now) + 1.0, now)

    def shares(self, engines: Sequence[str]) -> dict[str, float]:
        if not engines:
            return {}
        now = self.clock()
        counts = {e: self._decayed(e, now) for e in engines}
        total = sum(counts.values())
        if total <= 1e-9:
            return {e: 1.0 / len(engines) for e in engines}
        return {e: c / total for e, c in counts.items()}

    def forget(self, engine: str) -> None:
        self._counts.pop(engine, None)


@dataclass
class SessionMap:
    """x-session-id -> engine name, least recently used dropped past `max_entries`."""

    max_entries: int = 100_000
    _entries: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def get(self, session_id: str | None) -> str | None:
        if not session_id:
            return None
        engine = self._entries.get(session_id)
        if engine is not None:
            self._entries.move_to_end(session_id)
        return engine

    def set(self, session_id: str | None, engine: str) -> None:
        if not session_id:
            return
        self._entries[session_id] = engine
        self._entries.move_to_end(session_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def as_mapping(self, session_id: str | None) -> dict[str, str]:
        """The one entry the scorer needs for this request (RoutingSnapshot.sessions)."""
        engine = self.get(session_id)
        return {session_id: engine} if session_id and engine else {}

    def __len__(self) -> int:
        return len(self._entries)
