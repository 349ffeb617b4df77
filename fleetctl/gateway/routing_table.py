"""The gateway's cached copy of the controller's routing table (`GET /api/v1/routing`, docs/contracts.md).

The data plane outlives the control plane: when the controller is down, or answers with a table that does
not parse, the gateway keeps routing on the last good table and says how old it is (`age_s`, a metric and
a TUI field). A table is taken whole or not at all, never half-valid. Failed refreshes back off
exponentially with full jitter (`refresh_delay_s`), so a restarted controller is not stampeded.

`kv_events_endpoints` turns the table's engines into subscriptions for the KV event subscriber pool. The
contract carries only the PUB endpoint; the replay endpoint follows agent/launch.py's port layout
(PUB port + data-parallel size). Only data-parallel rank 0 is subscribed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from fleetctl.controller import contract
from fleetctl.gateway.kv_subscriber import KVEventsEndpoint
from fleetctl.replica_class import ReplicaClassSpec

log = logging.getLogger(__name__)

DEFAULT_REFRESH_INTERVAL_S = 2.0
DEFAULT_MAX_BACKOFF_S = 8.0  # as the agents' reconnect cap (agent/backoff.py): back within seconds, spread


@dataclass(frozen=True)
class EngineRoute:
    name: str
    node: str
    model: str
    class_ref: str
    role: str  # mixed | prefill | decode
    url: str | None
    state: str  # starting | ready | draining | stopped | failed
    kv_events_endpoint: str | None
    metrics: Mapping[str, Any]
    cordoned: bool = False  # an operator holds it out of traffic: only a probe naming it reaches it

    @property
    def routable(self) -> bool:
        """Ready with a URL: watched (health, metrics, KV events) whether or not it is cordoned."""
        return self.state == "ready" and self.url is not None


@dataclass(frozen=True)
class ModelRoute:
    traffic: Mapping[str, float]  # class_ref -> weight
    pd: bool
    classes: Mapping[str, ReplicaClassSpec]  # every class serving the model, zero-weight ones included


@dataclass(frozen=True)
class RoutingTable:
    generation: int
    models: Mapping[str, ModelRoute]
    engines: tuple[EngineRoute, ...]
    flags: Mapping[str, Any]

    def engines_of(self, model: str) -> list[EngineRoute]:
        return [e for e in self.engines if e.model == model]


def parse_routing_table(body: Mapping[str, Any]) -> RoutingTable:
    """The table, validated whole. Raises ValueError naming the field at fault."""
    try:
        models = {name: _parse_model(name, raw) for name, raw in body["models"].items()}
        engines = tuple(_parse_engine(raw) for raw in body["engines"])
        return RoutingTable(generation=int(body["generation"]), models=models, engines=engines, flags=dict(body["flags"]))
    except ValueError:
        raise
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"routing table: missing or malformed field {exc}") from None


def _parse_model(name: str, raw: Mapping[str, Any]) -> ModelRoute:
    classes = {}
    for ref, spec in raw["classes"].items():
        try:
            classes[ref] = ReplicaClassSpec.model_validate(spec)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"routing table: models.{name}.classes.{ref}: {exc}") from None
    traffic = {ref: float(weight) for ref, weight in raw["traffic"].items()}
    return ModelRoute(traffic=traffic, pd=bool(raw["pd"]), classes=classes)


def _parse_engine(raw: Mapping[str, Any]) -> EngineRoute:
    fields = ("name", "node", "model", "class_ref", "role", "url", "state", "kv_events_endpoint")
    return EngineRoute(**{f: raw[f] for f in fields}, metrics=dict(raw.get("metrics") or {}),
                       cordoned=bool(raw.get("cordoned", False)))


def kv_events_endpoints(table: RoutingTable, topic: str = "") -> list[KVEventsEndpoint]:
    """One subscription per routable engine that publishes KV events."""
    endpoints = []
    for engine in table.engines:
        if engine.routable and engine.kv_events_endpoint:
            spec = table.models.get(engine.model, ModelRoute({}, False, {})).classes.get(engine.class_ref)
            dp = spec.data_parallel_size if spec is not None and spec.backend == "vllm" else 1
            replay = _shift_port(engine.kv_events_endpoint, dp)
            endpoints.append(KVEventsEndpoint(engine.name, engine.kv_events_endpoint, replay, topic))
    return endpoints


def _shift_port(endpoint: str, offset: int) -> str | None:
    parts = urlsplit(endpoint)
    if parts.port is None:
        return None
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port + offset}"))


def refresh_delay_s(interval_s: float, failures: int, max_backoff_s: float, rng_value: float) -> float:
    """The wait before the next refresh: the interval after a success; after `failures` failures in a row,
    full jitter over min(max_backoff_s, interval_s * 2**failures). `rng_value` is a uniform draw in [0, 1)."""
    if failures == 0:
        return interval_s
    return rng_value * min(max_backoff_s, interval_s * 2 ** min(failures, 32))


class RoutingSource(Protocol):
    """What the cache needs of the controller client (fleetctl.client.AsyncControllerClient has it)."""

    async def routing(self) -> contract.RoutingTable: ...


@dataclass
class RoutingTableCache:
    """The last good routing table and its age; `run()` refreshes it until cancelled."""

    source: RoutingSource
    refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
    clock: Callable[[], float] = time.monotonic
    rng: Callable[[], float] = random.random
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    on_update: Callable[[RoutingTable], Awaitable[None]] | None = None  # e.g. KVSubscriberPool.sync
    # laid over each table fetched, e.g. direct mode's local flag overrides (gateway/direct.py)
    overlay: Callable[[RoutingTable], RoutingTable] | None = None
    table: RoutingTable | None = None  # what requests route on: the last table fetched, overlaid
    fetched: RoutingTable | None = None  # the last table fetched, as the controller sent it
    fetched_at: float | None = None  # clock() when `table` was fetched
    failures: int = 0  # refreshes failed in a row
    last_error: str | None = None

    def age_s(self) -> float | None:
        """Seconds since the table in use was fetched; None before the first one."""
        return None if self.fetched_at is None else self.clock() - self.fetched_at

    async def refresh_once(self) -> bool:
        """Fetch and take a new table; on any failure keep the last one. True when a table was taken."""
        try:
            table = parse_routing_table((await self.source.routing()).model_dump())
        except Exception as exc:  # unreachable, an HTTP error, or a table that does not parse
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("routing table refresh failed (%d in a row), keeping one %s s old: %s",
                        self.failures, _fmt_age(self.age_s()), self.last_error)
            return False
        changed = self.table is None or table.generation != self.table.generation
        self.fetched, self.fetched_at, self.failures, self.last_error = table, self.clock(), 0, None
        self.reapply()
        if changed and self.on_update is not None:
            await self.on_update(table)
        return True

    def reapply(self) -> None:
        """Lay the overlay over the last table fetched again (after the overlay changed)."""
        if self.fetched is not None:
            self.table = self.overlay(self.fetched) if self.overlay is not None else self.fetched

    async def run(self) -> None:
        while True:
            await self.refresh_once()
            await self.sleep(refresh_delay_s(self.refresh_interval_s, self.failures, self.max_backoff_s, self.rng()))


def _fmt_age(age: float | None) -> str:
    return "n/a" if age is None else f"{age:.1f}"
