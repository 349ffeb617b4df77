"""A routing table without a controller: `--engines URL[,URL...]`, for tests, benchmarks and break-glass.

Each entry is an engine base URL with optional query parameters:

    http://127.0.0.1:8100                                   a mixed engine
    http://127.0.0.1:8200?role=prefill                      a P/D prefill engine (role: mixed|prefill|decode)
    http://127.0.0.1:8100?kv_events=tcp://127.0.0.1:8101    its KV events PUB socket (replay: the next port)

The model, context window and block size are discovered from the engine itself (GET /v1/models: `id`,
`root`, `max_model_len`; GET /metrics: vllm:cache_config_info's `block_size`). Engines with the same
discovered spec share a class `static@rN`, all classes of a model get equal traffic, and a model with both
prefill and decode engines is P/D. The source answers `routing()` like the controller, so the same
RoutingTableCache refreshes it: an engine that does not answer keeps its last discovered entry (the
gateway's own health checks decide whether it gets traffic); one never discovered is left out. An engine not
yet discovered is asked on every refresh, one already discovered only every REDISCOVER_S: what discovery
reads changes only when the engine restarts, and its load comes from the gateway's probes (asking every
engine every refresh was about as much of the gateway's CPU as the probes themselves).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx

from engine.contract import REFERENCE_MODELS, ROLES
from fleetctl.controller import contract
from fleetctl.gateway.engine_metrics import parse_engine_metrics
from fleetctl.replica_class import ReplicaClassSpec

STATIC_CLASS = "static"
DISCOVERY_TIMEOUT_S = 3.0
REDISCOVER_S = 30.0


@dataclass(frozen=True)
class StaticEngine:
    name: str  # host:port
    url: str  # base URL, no query
    role: str = "mixed"
    kv_events_endpoint: str | None = None


def parse_static_engine(entry: str) -> StaticEngine:
    """One `--engines` entry; ValueError naming what is wrong."""
    parts = urlsplit(entry.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ValueError(f"engine {entry!r}: expected http(s)://HOST:PORT[?role=...&kv_events=...]")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - {"role", "kv_events"}
    if unknown:
        raise ValueError(f"engine {entry!r}: unknown option(s) {sorted(unknown)}; known: role, kv_events")
    role = query.get("role", "mixed")
    if role not in ROLES:
        raise ValueError(f"engine {entry!r}: role must be one of {ROLES}")
    url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return StaticEngine(parts.netloc, url, role, query.get("kv_events"))


def parse_static_engines(value: str | list[str] | tuple[str, ...]) -> list[StaticEngine]:
    entries = value.split(",") if isinstance(value, str) else [e for item in value for e in item.split(",")]
    engines = [parse_static_engine(e) for e in entries if e.strip()]
    names = [e.name for e in engines]
    if len(set(names)) != len(names):
        raise ValueError("an engine is listed twice")
    return engines


@dataclass(frozen=True)
class Discovered:
    engine: StaticEngine
    model: str
    spec: dict[str, Any]


class StaticTableSource:
    """routing() from the engines themselves (see the module docstring)."""

    def __init__(self, engines: list[StaticEngine], client: httpx.AsyncClient, flags: dict[str, Any] | None = None,
                 rediscover_s: float = REDISCOVER_S, clock: Callable[[], float] = time.monotonic):
        self.engines = engines
        self.client = client
        self.flags = dict(flags or {})
        self.rediscover_s = rediscover_s
        self.clock = clock
        self.known: dict[str, Discovered] = {}
        self.discovered_at: dict[str, float] = {}

    async def routing(self) -> contract.RoutingTable:
        now = self.clock()
        due = due_for_discovery(self.engines, self.discovered_at, now, self.rediscover_s)
        found = await asyncio.gather(*(self._discover(e) for e in due), return_exceptions=True)
        for engine, result in zip(due, found):
            if isinstance(result, Discovered):
                self.known[engine.name], self.discovered_at[engine.name] = result, now
        if not self.known:
            errors = "; ".join(f"{e.url}: {type(r).__name__}" for e, r in zip(due, found) if not isinstance(r, Discovered))
            raise ConnectionError(f"no engine answered discovery ({errors})")
        return contract.RoutingTable.model_validate(
            build_table([self.known[e.name] for e in self.engines if e.name in self.known], self.flags))

    async def _discover(self, engine: StaticEngine) -> Discovered:
        models = await self.client.get(f"{engine.url}/v1/models", timeout=DISCOVERY_TIMEOUT_S)
        models.raise_for_status()
        card = models.json()["data"][0]
        metrics = await self.client.get(f"{engine.url}/metrics", timeout=DISCOVERY_TIMEOUT_S)
        sample = parse_engine_metrics(metrics.text) if metrics.status_code == 200 else None
        return Discovered(engine, str(card["id"]), spec_from_card(card, sample.block_size if sample else None))


def due_for_discovery(engines: list[StaticEngine], discovered_at: dict[str, float], now: float,
                      rediscover_s: float) -> list[StaticEngine]:
    """The engines to ask this refresh: those never discovered, and those last discovered rediscover_s ago."""
    return [e for e in engines if e.name not in discovered_at or now - discovered_at[e.name] >= rediscover_s]


def spec_from_card(card: dict[str, Any], block_size: int | None) -> dict[str, Any]:
    """A replica class spec for what a /v1/models card says (validated by ReplicaClassSpec)."""
    model, root = str(card["id"]), str(card.get("root") or card["id"])
    reference = root in REFERENCE_MODELS
    spec: dict[str, Any] = {"model": model, "backend": "reference" if reference else "vllm", "weights": root}
    if card.get("max_model_len"):
        spec["max_model_len"] = int(card["max_model_len"])
    if block_size:
        spec["block_size"] = block_size
    return ReplicaClassSpec.model_validate(spec).model_dump(mode="json")


def build_table(found: list[Discovered], flags: dict[str, Any]) -> dict[str, Any]:
    """The controller's routing-table shape (docs/contracts.md) for discovered engines."""
    class_refs = _class_refs(found)
    models: dict[str, dict[str, Any]] = defaultdict(lambda: {"traffic": {}, "pd": False, "classes": {}})
    roles: dict[str, set[str]] = defaultdict(set)
    engines = []
    for d in found:
        ref = class_refs[_spec_key(d.spec)]
        entry = models[d.model]
        entry["traffic"][ref] = 1.0
        entry["classes"][ref] = d.spec
        roles[d.model].add(d.engine.role)
        host = urlsplit(d.engine.url).hostname or "localhost"
        engines.append({"name": d.engine.name, "node": host, "model": d.model, "class_ref": ref, "role": d.engine.role,
                        "url": d.engine.url, "state": "ready", "kv_events_endpoint": d.engine.kv_events_endpoint,
                        "metrics": {}})
    for model, entry in models.items():
        entry["pd"] = {"prefill", "decode"} <= roles[model]
    table = {"models": dict(models), "engines": engines, "flags": dict(flags)}
    canonical = json.dumps(table, sort_keys=True).encode()
    return {"generation": int.from_bytes(hashlib.sha256(canonical).digest()[:7], "big"), **table}


def _spec_key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)


def _class_refs(found: list[Discovered]) -> dict[str, str]:
    keys = sorted({_spec_key(d.spec) for d in found})
    return {key: f"{STATIC_CLASS}@r{i}" for i, key in enumerate(keys, 1)}
