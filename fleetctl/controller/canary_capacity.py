"""The fleet's busy capacity, in served tokens/s: what the canary's probe budget is a share of.

Agents report each engine's cumulative served-token counters in its metrics (`prompt_tokens` +
`generation_tokens`, vLLM's vllm:prompt_tokens_total and vllm:generation_tokens_total); the heartbeat
buffer rewrites an engine's row, with `updated_at`, at least every few seconds while it reports. From two
successive readings of one engine, its rate is the counter's growth over the time between them; the fleet's
rate is the sum over the engines read now. The busy capacity is the peak fleet rate over the trailing
window (canary_capacity_window_s): the most the fleet was seen to serve lately.

`ServedCapacity` keeps, bounded: per engine its last reading and rate (engines no longer read are
forgotten), and the peak rate per slice of the window (`SLICES` of them). A counter that went down (the
engine restarted) has rate 0 until its next reading. It lives in the leader's memory: a new leader starts
from no capacity (probes run at the floor rate) until it has two readings of some engine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.models import Engine, Node
from fleetctl.controller.nodes import UP

SLICES = 240  # the window is kept as this many slices' peaks (an hour: 15 s each)
SERVED_COUNTERS = ("prompt_tokens", "generation_tokens")


@dataclass(frozen=True)
class EngineReading:
    engine: tuple[str, str]  # (node, engine name)
    at: datetime  # when its agent reported it (the row's updated_at)
    tokens: float  # its served-token counters, summed


@dataclass(frozen=True)
class _Seen:
    at: datetime
    tokens: float
    rate: float


def served_tokens(metrics: dict[str, Any] | None) -> float:
    """prompt + generation tokens from an engine's stored metrics (0 for what an older agent leaves out)."""
    total = 0.0
    for name in SERVED_COUNTERS:
        value = (metrics or {}).get(name, 0)
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            total += float(value)
    return total


def read_engines(session: Session) -> list[EngineReading]:
    """Every engine on an up node, with its served-token counters."""
    rows = session.execute(
        select(Engine.node, Engine.name, Engine.updated_at, Engine.metrics)
        .join(Node, Node.name == Engine.node).where(Node.state == UP)
    ).tuples()
    return [EngineReading((node, name), at, served_tokens(metrics)) for node, name, at, metrics in rows]


class ServedCapacity:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self.slice_s = window_s / SLICES
        self._engines: dict[tuple[str, str], _Seen] = {}
        self._peaks: dict[int, float] = {}  # slice index -> the peak fleet rate seen in it

    def observe(self, readings: Iterable[EngineReading], now: datetime) -> float:
        """Take this pass's readings; returns the fleet's served tokens/s now."""
        seen: dict[tuple[str, str], _Seen] = {}
        for reading in readings:
            seen[reading.engine] = self._advance(self._engines.get(reading.engine), reading)
        self._engines = seen
        rate = sum(s.rate for s in seen.values())
        index = self._slice(now)
        self._peaks[index] = max(self._peaks.get(index, 0.0), rate)
        self._forget_before(index - SLICES)
        return rate

    def capacity(self, now: datetime) -> float:
        """The peak fleet rate over the trailing window (0.0 when nothing was measured)."""
        oldest = self._slice(now) - SLICES
        return max((peak for index, peak in self._peaks.items() if index > oldest), default=0.0)

    def _slice(self, now: datetime) -> int:
        return math.floor(now.timestamp() / self.slice_s)

    def _forget_before(self, oldest: int) -> None:
        for index in [i for i in self._peaks if i <= oldest]:
            del self._peaks[index]

    @staticmethod
    def _advance(last: _Seen | None, reading: EngineReading) -> _Seen:
        if last is None:
            return _Seen(reading.at, reading.tokens, 0.0)
        elapsed = (reading.at - last.at).total_seconds()
        if elapsed <= 0:  # the same report as last time: the rate stands
            return last
        if reading.tokens < last.tokens:  # the counter restarted with its engine
            return _Seen(reading.at, reading.tokens, 0.0)
        return _Seen(reading.at, reading.tokens, (reading.tokens - last.tokens) / elapsed)
