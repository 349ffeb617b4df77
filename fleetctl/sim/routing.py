"""Routing on many independent engines, simulated: the gateway's scorer against a radix-tree cache_aware router
(sglang-router's and vllm-router's policy) and round robin, on a prompt workload in the Mooncake schema.

Each engine is its own machine (as GPU replicas are): a prefill server taking one prompt at a time in arrival
order, whose prefill takes (prompt tokens not in its cache) / `prefill_tokens_per_s`, slowed by
`decode_slowdown` per decode running beside it; then the request decodes for `output tokens x decode_step_s`.
Its prefix cache holds `cache_blocks` blocks, least recently used dropped first; a prompt's blocks enter it when
the prompt is routed there (a router sees a prefix routed to an engine as held, as the gateway counts prefixes
in flight). A prompt reuses the leading run of its blocks the cache holds when its prefill starts.

Policies (`POLICIES`), each a function of the request and the simulator's state at its arrival:
- `gateway`: fleetctl.gateway.scorer.rank_engines over EngineViews built from that state, with the gateway's
  recent-share tracker (hot-spot guard) and default policy: the live gateway's decision; with `warm` on, also
  prefix_warming.plan_warm's decision, whose warm then occupies the idle engine's prefill server for the
  prefix's uncached tokens and puts the prefix in its cache, unless a request is sent there first: then the
  warm yields (it stops, and only the blocks it completed stay cached);
- `cache_aware`: the peers' policy (../shared/reference/peer-routers.md): each router keeps an approximate tree
  of what it routed where (no eviction here: the peers evict on a timer); if the busiest engine's in-flight count
  exceeds the idlest's by more than `balance_abs` and by more than `balance_rel` times, the least loaded; else
  the engine with the deepest match when the matched fraction of the prompt exceeds `cache_threshold`, else the
  least loaded (ties: the lower engine index);
- `round_robin`.

Deterministic: no randomness beyond the workload's.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl.gateway.prefix_popularity import PrefixPopularity
from fleetctl.gateway.prefix_warming import WarmPolicy, counts_popularity, plan_warm
from fleetctl.gateway.scorer import EngineView, RouteRequest, RoutingSnapshot, ScorerPolicy, rank_engines
from fleetctl.gateway.traffic import ShareTracker

POLICIES = ("gateway", "cache_aware", "round_robin")


@dataclass(frozen=True)
class RoutingSimConfig:
    engines: int = 16
    block_tokens: int = 16  # real tokens per trace block (hash id), as benchmarks/routing.py maps them
    max_prompt_blocks: int = 32
    max_output_tokens: int = 16
    prefill_tokens_per_s: float = 4000.0
    decode_step_s: float = 0.02
    decode_slowdown: float = 0.02  # prefill takes (1 + this x running decodes) longer
    cache_blocks: int = 2048
    cache_threshold: float = 0.3  # cache_aware's flags, as the routing benchmark runs the peers
    balance_abs: int = 64
    balance_rel: float = 1.5
    share_half_life_requests_per_engine: float = 32.0  # the gateway's --share-half-life-requests-per-engine
    scorer: ScorerPolicy = field(default_factory=ScorerPolicy)  # the gateway's scorer flags, as it runs them
    warm: WarmPolicy = field(default_factory=WarmPolicy)  # the gateway's --warm-prefix-requests, as it runs it


@dataclass(frozen=True)
class SimRequest:
    arrival_s: float
    blocks: tuple[int, ...]  # trace block ids (each `block_tokens` tokens)
    output_tokens: int


@dataclass
class SimEngine:
    name: str
    cache: OrderedDict[tuple[int, ...], None] = field(default_factory=OrderedDict)  # chained prefixes, LRU first
    free_at: float = 0.0  # when its prefill server finishes what it was given
    jobs: list[tuple[float, float, float]] = field(default_factory=list)  # (prefill start, first token, last token)
    routed_tree: set[tuple[int, ...]] = field(default_factory=set)  # cache_aware's picture of it
    warm: tuple[float, float, tuple[int, ...], int] | None = None  # (start, end, blocks, cached before) of its warm

    def cached_blocks(self, blocks: Sequence[int]) -> int:
        run = 0
        while run < len(blocks) and tuple(blocks[: run + 1]) in self.cache:
            run += 1
        return run

    def insert(self, blocks: Sequence[int], capacity: int) -> None:
        for end in range(1, len(blocks) + 1):
            key = tuple(blocks[:end])
            self.cache[key] = None
            self.cache.move_to_end(key)
        while len(self.cache) > capacity:
            self.cache.popitem(last=False)

    def yield_warm(self, t: float) -> None:
        """A request is sent here at `t`: a warm still prefilling stops (the gateway cancels it, warmer.py), and
        only the blocks it completed stay cached."""
        if self.warm is None:
            return
        start, end, blocks, cached = self.warm
        self.warm = None
        if t >= end:
            return
        done = cached + int((len(blocks) - cached) * max(0.0, t - start) / (end - start))
        for k in range(done + 1, len(blocks) + 1):
            self.cache.pop(tuple(blocks[:k]), None)
        self.free_at = t
        self.jobs = [job for job in self.jobs if job != (start, end, end)] + [(start, t, t)]

    def running_at(self, t: float) -> int:
        """Requests decoding at `t`."""
        return sum(1 for _, first, last in self.jobs if first <= t < last)

    def waiting_at(self, t: float) -> int:
        """Requests given to it whose prefill has not started at `t`."""
        return sum(1 for start, _, _ in self.jobs if start > t)

    def in_flight_at(self, t: float) -> int:
        """Requests given to it and not finished at `t` (a router's own in-flight count)."""
        return sum(1 for _, _, last in self.jobs if last > t)


@dataclass(frozen=True)
class SimOutcome:
    ttft_s: float
    e2e_s: float
    engine: int
    prompt_tokens: int
    cached_tokens: int


Router = Callable[[SimRequest, float, Sequence[SimEngine]], int]


def requests_from_rows(rows: Sequence[Mapping[str, Any]], config: RoutingSimConfig) -> list[SimRequest]:
    t0 = min((r["timestamp"] for r in rows), default=0)
    return [SimRequest((r["timestamp"] - t0) / 1000.0, tuple(r["hash_ids"][: config.max_prompt_blocks]),
                       max(1, min(config.max_output_tokens, int(r["output_length"]))))
            for r in sorted(rows, key=lambda r: r["timestamp"])]


def gateway_router(config: RoutingSimConfig, policy: ScorerPolicy | None = None) -> Router:
    policy = policy or config.scorer
    shares = ShareTracker(config.share_half_life_requests_per_engine, engines=config.engines)
    popularity = PrefixPopularity(shares.half_life_requests)

    def route(request: SimRequest, t: float, engines: Sequence[SimEngine]) -> int:
        names = [e.name for e in engines]
        share = shares.shares(names)
        views = [EngineView(
            engine_id=e.name, role="mixed", class_ref="sim", healthy=True, num_running=e.running_at(t),
            num_waiting=e.waiting_at(t), kv_cache_usage=min(1.0, len(e.cache) / config.cache_blocks),
            queued_prefill_tokens=int(max(0.0, e.free_at - t) * config.prefill_tokens_per_s),
            prefill_tokens_per_s=config.prefill_tokens_per_s, cached_blocks=e.cached_blocks(request.blocks),
            recent_share=share[e.name], block_size=config.block_tokens, decode_step_s=config.decode_step_s)
            for e in engines]
        # trace ids are not chained: a prefix is the tuple of its blocks (counted only when a policy uses them)
        prefixes = ([request.blocks[: k + 1] for k in range(len(request.blocks))]
                    if counts_popularity(policy, config.warm) else [])
        route_request = RouteRequest(request.blocks, len(request.blocks) * config.block_tokens,
                                     prefix_requests=popularity.counts(prefixes))
        chosen = rank_engines(route_request, RoutingSnapshot(views), policy)[0].engine_id
        warm = plan_warm(route_request, chosen, views, (), config.warm, policy.engines_share_hardware)
        if warm is not None:
            prefill_warm(engines[names.index(warm.engine_id)], request.blocks[: warm.blocks], t, config)
        shares.record(chosen)
        popularity.record(prefixes)
        return names.index(chosen)

    return route


def prefill_warm(engine: SimEngine, blocks: Sequence[int], t: float, config: RoutingSimConfig) -> None:
    """A warm on an idle engine: its prefill server computes the uncached blocks (no decode), then holds them."""
    cached = engine.cached_blocks(blocks)
    start = max(t, engine.free_at)
    engine.free_at = start + (len(blocks) - cached) * config.block_tokens / config.prefill_tokens_per_s
    engine.jobs.append((start, engine.free_at, engine.free_at))
    engine.warm = (start, engine.free_at, tuple(blocks), cached)
    engine.insert(blocks, config.cache_blocks)


def cache_aware_router(config: RoutingSimConfig) -> Router:
    def route(request: SimRequest, t: float, engines: Sequence[SimEngine]) -> int:
        loads = [e.in_flight_at(t) for e in engines]
        least = min(range(len(engines)), key=lambda i: (loads[i], i))
        if max(loads) - min(loads) > config.balance_abs and max(loads) > config.balance_rel * min(loads):
            chosen = least
        else:
            matches = [_tree_match(e.routed_tree, request.blocks) for e in engines]
            deepest = max(range(len(engines)), key=lambda i: (matches[i], -i))
            ratio = matches[deepest] / len(request.blocks) if request.blocks else 0.0
            chosen = deepest if ratio > config.cache_threshold else least
        engines[chosen].routed_tree.update(tuple(request.blocks[: k + 1]) for k in range(len(request.blocks)))
        return chosen

    return route


def _tree_match(tree: set[tuple[int, ...]], blocks: Sequence[int]) -> int:
    run = 0
    while run < len(blocks) and tuple(blocks[: run + 1]) in tree:
        run += 1
    return run


def round_robin_router() -> Router:
    counter = [0]

    def route(request: SimRequest, t: float, engines: Sequence[SimEngine]) -> int:
        counter[0] += 1
        return (counter[0] - 1) % len(engines)

    return route


def make_router(name: str, config: RoutingSimConfig) -> Router:
    if name == "gateway":
        return gateway_router(config)
    if name == "cache_aware":
        return cache_aware_router(config)
    if name == "round_robin":
        return round_robin_router()
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


def simulate(requests: Sequence[SimRequest], router: Router, config: RoutingSimConfig) -> list[SimOutcome]:
    engines = [SimEngine(f"e{i:03d}") for i in range(config.engines)]
    outcomes = []
    for request in requests:
        t = request.arrival_s
        index = router(request, t, engines)
        engine = engines[index]
        engine.yield_warm(t)
        start = max(t, engine.free_at)
        cached = engine.cached_blocks(request.blocks)
        prompt_tokens = len(request.blocks) * config.block_tokens
        uncached = max(1, prompt_tokens - cached * config.block_tokens)  # the last token is always computed
        prefill_s = uncached / config.prefill_tokens_per_s * (1 + config.decode_slowdown * engine.running_at(start))
        first = start + prefill_s
        last = first + request.output_tokens * config.decode_step_s
        engine.free_at = first
        engine.jobs = [job for job in engine.jobs if job[2] > t] + [(start, first, last)]  # finished ones never count again
        engine.insert(request.blocks, config.cache_blocks)
        outcomes.append(SimOutcome(first - t, last - t, index, prompt_tokens, min(cached * config.block_tokens,
                                                                                 prompt_tokens - 1)))
    return outcomes


def summarise(outcomes: Sequence[SimOutcome], engines: int) -> dict[str, float]:
    ttfts = sorted(o.ttft_s for o in outcomes)
    per_engine = [0] * engines
    for o in outcomes:
        per_engine[o.engine] += 1
    prompt = sum(o.prompt_tokens for o in outcomes)
    return {
        "requests": len(outcomes),
        "ttft_p50_s": _quantile(ttfts, 0.5), "ttft_p90_s": _quantile(ttfts, 0.9), "ttft_p99_s": _quantile(ttfts, 0.99),
        "e2e_mean_s": sum(o.e2e_s for o in outcomes) / len(outcomes) if outcomes else math.nan,
        "hit_rate": sum(o.cached_tokens for o in outcomes) / prompt if prompt else math.nan,
        "busiest_share": max(per_engine) / len(outcomes) if outcomes else math.nan,
    }


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
