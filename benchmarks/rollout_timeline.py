"""When did every gateway route on a given traffic split? A watcher thread samples, every `every_s`:

- the controller's routing table (`GET /api/v1/routing`, what gateways read): its generation and the
  model's traffic weights;
- each gateway's `GET /health`: the table generation it routes on.

The pure functions below read those samples: `first_generation` finds the first table (after a moment)
whose weights satisfy a predicate (e.g. B's weight is 0), `applied_at` the moment the last gateway reported
a generation at or past it. Both are as precise as the sampling period; a later routing change that lands
between two samples makes the generation found one step newer, so a latency read this way errs long.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

Weights = Mapping[str, float]


@dataclass(frozen=True)
class TableSample:
    at: float  # time.monotonic() when the answer arrived
    generation: int
    weights: Weights  # the model's traffic


@dataclass(frozen=True)
class GatewaySample:
    at: float
    gateway: str
    generation: int | None


def first_generation(tables: Sequence[TableSample], since: float, holds: Callable[[Weights], bool]) -> int | None:
    """The generation of the first table sampled at or after `since` whose weights satisfy `holds`."""
    for sample in sorted(tables, key=lambda s: s.at):
        if sample.at >= since and holds(sample.weights):
            return sample.generation
    return None


def applied_at(samples: Sequence[GatewaySample], gateways: Sequence[str], generation: int, since: float) -> float | None:
    """When the last of `gateways` was first seen (at or after `since`) routing on `generation` or later."""
    moments = []
    for gateway in gateways:
        seen = [s.at for s in samples if s.gateway == gateway and s.at >= since
                and s.generation is not None and s.generation >= generation]
        if not seen:
            return None
        moments.append(min(seen))
    return max(moments) if moments else None


def only_on(ref: str) -> Callable[[Weights], bool]:
    """Predicate: all of the model's weight is on `ref`."""
    return lambda weights: weights.get(ref, 0.0) > 0 and all(w <= 0 for r, w in weights.items() if r != ref)


def share_of(ref: str, percent: float) -> Callable[[Weights], bool]:
    """Predicate: `ref` has `percent` of the model's weight (a rollout's setWeight step)."""
    def holds(weights: Weights) -> bool:
        total = sum(w for w in weights.values() if w > 0)
        return total > 0 and abs(100 * max(weights.get(ref, 0.0), 0.0) / total - percent) < 1e-6
    return holds


class Watcher:
    """Samples the controller's table and every gateway's generation on a thread, until stopped."""

    def __init__(self, controller_url: str, token: str, gateways: Mapping[str, str], model: str, every_s: float = 0.1):
        self.controller_url, self.token, self.gateways, self.model = controller_url, token, dict(gateways), model
        self.every_s = every_s
        self.tables: list[TableSample] = []
        self.samples: list[GatewaySample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)

    def start(self) -> "Watcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def wait_applied(self, holds: Callable[[Weights], bool], since: float, timeout_s: float) -> tuple[int, float] | None:
        """Block until every gateway routes on a table (first seen after `since`) satisfying `holds`;
        (generation, moment), or None on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            generation = first_generation(list(self.tables), since, holds)
            if generation is not None:
                moment = applied_at(list(self.samples), list(self.gateways), generation, since)
                if moment is not None:
                    return generation, moment
            time.sleep(self.every_s)
        return None

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(timeout=5.0) as client:
            while not self._stop.is_set():
                self._sample_table(client, headers)
                for name, url in self.gateways.items():
                    self._sample_gateway(client, name, url)
                self._stop.wait(self.every_s)

    def _sample_table(self, client: httpx.Client, headers: dict[str, str]) -> None:
        try:
            body = client.get(self.controller_url + "/api/v1/routing", headers=headers).json()
            weights = body["models"].get(self.model, {}).get("traffic", {})
            self.tables.append(TableSample(time.monotonic(), int(body["generation"]), dict(weights)))
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass  # a missed sample only widens the error bar

    def _sample_gateway(self, client: httpx.Client, name: str, url: str) -> None:
        try:
            generation = client.get(url + "/health").json().get("table_generation")
            self.samples.append(GatewaySample(time.monotonic(), name, generation))
        except (httpx.HTTPError, ValueError):
            pass
