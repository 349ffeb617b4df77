"""The simulator's clock: a queue of timed events, popped in time order.

Events at the same instant pop in the order they were pushed (a sequence number breaks ties), so a run
is a deterministic function of its inputs: no set or hash order decides anything.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from enum import Enum
from typing import Any


class EventKind(str, Enum):
    ARRIVAL = "arrival"  # payload: the request
    PREFILL_DONE = "prefill_done"  # payload: the prefill engine
    STEP_DONE = "step_done"  # payload: the decode engine
    SAMPLE = "sample"  # payload: None
    ENGINE_JOIN = "engine_join"  # payload: the role of an engine back from a role flip


@dataclass(frozen=True)
class Event:
    t_s: float
    kind: EventKind
    payload: Any


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, EventKind, Any]] = []  # (time, sequence, kind, payload)
        self._seq = itertools.count()
        self.now = 0.0

    def push(self, t_s: float, kind: EventKind, payload: Any = None) -> None:
        heapq.heappush(self._heap, (t_s, next(self._seq), kind, payload))

    def peek_time(self) -> float:
        return self._heap[0][0]

    def pop(self) -> Event:
        """The next event; the clock moves to its time."""
        t_s, _, kind, payload = heapq.heappop(self._heap)
        self.now = t_s
        return Event(t_s, kind, payload)

    def __bool__(self) -> bool:
        return bool(self._heap)
