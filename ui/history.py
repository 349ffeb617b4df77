"""Recent figures of every engine, for the engine detail's sparklines: TTFT, ITL, queue (running + waiting)
and KV usage, one sample each time the stream reports a change of the engine.

Memory is bounded: each engine keeps SAMPLES samples per series in fixed `array('f')` rings (4 bytes a
sample, 4 series: about 2 KiB an engine, 8 MiB for 4,000 engines), and an engine's rings are dropped when it
leaves the fleet (a delete, or absent from a new snapshot). Nothing else grows.

    history = EngineHistory()
    history.record(fleet, applied)          # after each FleetState.apply
    history.series("node-1/e-1", "ttft")    # oldest first; NaN where the figure was not known
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

from fleetctl.watch_state import Applied, FleetState

SAMPLES = 120  # per series and engine
SERIES = ("ttft", "itl", "queue", "kv")
NAN = float("nan")


def engine_figures(raw: Mapping[str, Any]) -> tuple[float, float, float, float]:
    """(ttft_s, itl_s, queue, kv usage 0..1) of an engine's stream value (a dict), NaN where unknown.
    Reads the raw dict: the hot path of a 4,000-engine fleet does not parse models."""
    metrics = raw.get("metrics") or {}
    rates = raw.get("rates") or {}
    running, waiting = metrics.get("num_requests_running"), metrics.get("num_requests_waiting")
    queue = NAN if running is None and waiting is None else _float(running or 0) + _float(waiting or 0)
    return (_float(rates.get("ttft_s")), _float(rates.get("itl_s")), queue,
            _float(metrics.get("kv_cache_usage_perc")))


def _float(value: Any) -> float:
    if type(value) is float:  # the common case first: this runs for 4 figures of every engine each second
        return value
    try:
        return NAN if value is None else float(value)
    except (TypeError, ValueError):
        return NAN


class Ring:
    """The last SAMPLES values of one engine's 4 series, in one array (series i at i * SAMPLES), oldest
    overwritten."""

    __slots__ = ("values", "head", "size")

    def __init__(self) -> None:
        self.values = array("f", [NAN]) * (SAMPLES * len(SERIES))
        self.head = 0  # where the next sample goes
        self.size = 0

    def push(self, figures: tuple[float, float, float, float]) -> None:
        values, head = self.values, self.head
        values[head], values[SAMPLES + head], values[2 * SAMPLES + head], values[3 * SAMPLES + head] = figures
        self.head = head + 1 if head + 1 < SAMPLES else 0
        if self.size < SAMPLES:
            self.size += 1

    def series(self, index: int) -> list[float]:
        values, offset = self.values, index * SAMPLES
        start = (self.head - self.size) % SAMPLES
        return [values[offset + (start + i) % SAMPLES] for i in range(self.size)]


class EngineHistory:
    def __init__(self) -> None:
        self._rings: dict[str, Ring] = {}

    def __len__(self) -> int:
        return len(self._rings)

    def record(self, fleet: FleetState, applied: Applied) -> None:
        """One sample of each engine `applied` changed (every engine on a reset); forget engines gone."""
        engines = fleet.resources.get("engine", {})
        if applied.reset:
            for key in [key for key in self._rings if key not in engines]:
                del self._rings[key]
            self._sample(engines, engines.keys())
            return
        rings = self._rings
        for kind, key in applied.changed:
            if kind != "engine":
                continue
            raw = engines.get(key)
            if raw is None:
                rings.pop(key, None)
                continue
            ring = rings.get(key)
            if ring is None:
                ring = rings[key] = Ring()
            ring.push(engine_figures(raw))

    def _sample(self, engines: Mapping[str, Mapping[str, Any]], keys: Iterable[str]) -> None:
        for key in keys:
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = Ring()
            ring.push(engine_figures(engines[key]))

    def series(self, key: str, name: str) -> list[float]:
        """The samples of `name` (one of SERIES) for engine `key`, oldest first; [] when none."""
        ring = self._rings.get(key)
        return [] if ring is None else ring.series(SERIES.index(name))


def known(values: Iterable[float]) -> list[float]:
    """The samples that are known (a sparkline draws no NaN)."""
    return [value for value in values if not math.isnan(value)]
