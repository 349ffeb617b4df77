"""Rank a model's engines for one request: prefix locality and load in ONE score, with a hot-spot guard.

Cache-aware routing alone put 99.92% of llm-d's shared-prefix traffic on one pod; least-connections alone
spreads a shared prefix and recomputes it everywhere. So the score prices both in the same unit, seconds
of predicted time to first token (higher is better, so the terms are negated costs):

    score = locality_weight * damping * saved_s           prefill the cached prefix saves here
          - prefill_weight * work_s                       prefill work ahead of and including this prompt
          - seconds_per_waiting * num_waiting             queueing beyond the prefill estimate
          - seconds_per_running * num_running             decodes sharing every step with our prefill
          - kv_full_penalty_s * kv_pressure**2            preemption risk as KV fills

    saved_s     = min(cached_blocks * block_size, num_prompt_tokens) / prefill_tokens_per_s
    work_s      = (queued_prefill_tokens + num_prompt_tokens) / prefill_tokens_per_s + fetch_s
    kv_pressure = max(0, kv_cache_usage - kv_soft_limit) / (1 - kv_soft_limit)      (0..1)

Blocks held only in a node tier (`tier_blocks`: the node's DRAM "CPU", its disk "STORAGE") count in saved_s
like blocks in memory, and their fetch time, `fetch_s` = sum of blocks x the engine's measured seconds per block
of that tier (`tier_fetch_s`; the policy's defaults until it has fetched any), is added to work_s. So a tier
hit is worth locality_weight x its recompute time less its fetch time: memory beats DRAM beats disk at equal
load, and a tier too slow to beat recomputing (fetch > locality_weight x recompute) loses to an engine that
recomputes. The fetch counts once, not twice, because it delays only this request: the engine computes others
while the blocks arrive.

With both weights at 1 the first two terms are minus the predicted prefill time, (queued + uncached) /
throughput, so the weights read as "how much is a second of saved prefill worth against a second of queue".
Defaults: locality 2.0, prefill 1.0, 0.02 s per waiting, 0.005 s per running, KV soft limit 0.8 with a
5 s penalty at 100%. Locality counts twice because a hit saves the engine's time as well as this request's:
a recomputed prefix delays everything queued behind it on that engine (and, where engines share hardware,
on its neighbours). On benchmarks/routing.py's slice weight 2 gave a lower P90 TTFT than weight 1 at the
same hit rate.

Hot-spot guard: an engine whose recent share of traffic exceeds `hot_spot_factor` x the mean share of the
eligible engines has its locality bonus multiplied by `hot_spot_damping` (default 0: its cache is ignored),
so it competes on load alone until its share falls back. A popular prefix therefore holds its engine near
factor x mean share, and spills to others, which then cache it too. The guard is off when the engines share
hardware (`engines_share_hardware`: several engines on the same cores or GPU): there a spill buys no
parallelism, only a recomputed prefix (on benchmarks/routing.py's shared testbed the guard's diversions were
most of the agent-session tail; docs/benchmarks.md).

Shared prefixes (`shared_prefix_requests` S > 0): a prefix that many recent requests began with (a tenant's
system prompt, a document every RAG query cites) is worth caching on every engine, since a miss on it is
paid once per engine and then serves every later request that shares it. So a holder's locality bonus is
multiplied by min(1, S / p), where p is the number of recent requests that began with the prefix it holds
for this request (`RouteRequest.prefix_requests`, prefix_popularity.py): the recompute is priced as spread
over the requests that will reuse it, and the request goes where the load is lower. A session's history
(p = its few earlier turns) keeps its full price. Like the guard, this is off where engines share hardware.

Where engines share hardware, `shared_hardware_own_load` w < 1 charges each engine w x its own load terms
(queued prefill, waiting, running) plus (1 - w) x the mean over the eligible engines: their queues draw on
the same cores, so a request sent to an idle neighbour still waits for the cores the busy one is using,
while a prefix hit saves that work outright. w = 0 ranks by locality alone with load breaking ties (on
benchmarks/routing.py's shared testbed it sent every RAG request to one engine); the default 0.5 routed agent
sessions as the peer routers do and lowered RAG's P90, and left the system-prompt shape's decisions unchanged
(docs/benchmarks.md). w = 1 is an engine's own load only, as on independent hardware.

Running decodes: `seconds_per_running` prices each, unless `running_cost_steps` > 0 prices it as that many
of the engine's measured decode steps (`EngineView.decode_step_s`; on a one-core engine a running decode
costs a new request far more than a GPU's few milliseconds).

Ties (equal scores) go to the lower recent share, then the longer cached prefix, then the engine id.
Sessions stick to their previous engine when its score is within `session_margin_s` of the best.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from fleetctl.gateway.prefix_index import EngineId


@dataclass(frozen=True)
class RouteRequest:
    """What the scorer knows about a request."""

    block_hashes: Sequence[int]  # the prompt's full-block hashes (engine.hashing.block_hashes_int64)
    num_prompt_tokens: int
    session_id: str | None = None  # x-session-id
    class_ref: str | None = None  # only engines of this class (choose_class picked it); None: any
    roles: frozenset[str] | None = None  # only engines with these roles; None: any
    # recent requests that began with each prefix of block_hashes (PrefixPopularity.counts); () when unknown
    prefix_requests: Sequence[float] = ()


@dataclass(frozen=True)
class EngineView:
    """One engine as the router sees it at decision time."""

    engine_id: EngineId
    role: str  # prefill | decode | mixed
    class_ref: str
    healthy: bool
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    queued_prefill_tokens: int  # estimate of prompt tokens still to prefill
    prefill_tokens_per_s: float  # estimate; <= 0 means unknown (the policy's default is used)
    cached_blocks: int  # leading blocks of THIS request held (PrefixIndex.longest_prefix)
    recent_share: float  # recent fraction of this model's traffic routed here (0..1)
    block_size: int = 16
    # of cached_blocks, those the engine will fetch from its node's tiers, by medium (PrefixHit.tier_blocks)
    tier_blocks: tuple[tuple[str, int], ...] = ()
    tier_fetch_s: tuple[tuple[str, float], ...] = ()  # measured seconds per block fetched, by medium
    decode_step_s: float = 0.0  # the engine's measured seconds per decode step; 0: unknown

    @property
    def memory_blocks(self) -> int:
        return self.cached_blocks - sum(n for _, n in self.tier_blocks)


@dataclass(frozen=True)
class RoutingSnapshot:
    engines: Sequence[EngineView]
    sessions: Mapping[str, EngineId] = field(default_factory=dict)  # session id -> engine it last used


@dataclass(frozen=True)
class ScorerPolicy:
    """Weights of the score; every term is in seconds (see the module docstring)."""

    locality_weight: float = 2.0  # per second of prefill saved by the cached prefix (see the module docstring)
    prefill_weight: float = 1.0  # per second of predicted prefill work (queue + whole prompt)
    seconds_per_waiting: float = 0.02  # per request waiting on the engine
    seconds_per_running: float = 0.005  # per request running on the engine
    kv_soft_limit: float = 0.8  # KV usage above which the penalty starts (0..1)
    kv_full_penalty_s: float = 5.0  # the penalty at 100% KV usage (quadratic from the soft limit)
    hot_spot_factor: float = 1.5  # an engine above factor x mean share is a hot spot
    hot_spot_damping: float = 0.0  # multiplier of a hot spot's locality bonus
    engines_share_hardware: bool = False  # True: no hot-spot guard (a spill would buy no parallelism)
    shared_hardware_own_load: float = 0.5  # sharing hardware: weight of an engine's own load vs the pool's mean
    shared_prefix_requests: float = 0.0  # S: a prefix p recent requests began with costs min(1, S/p); 0: off
    running_cost_steps: float = 0.0  # a running decode costs this many measured decode steps; 0: seconds_per_running
    session_margin_s: float = 0.25  # a session keeps its engine when within this of the best score
    default_prefill_tokens_per_s: float = 2000.0  # when an engine has no throughput estimate yet
    # seconds to fetch one block from a node tier, until the engine has measured its own (benchmarks/kv_tiers.py
    # measured 4.9 ms per block from disk on the reference engine; DRAM is the same HTTP fetch without the read)
    default_tier_fetch_s: tuple[tuple[str, float], ...] = (("CPU", 0.002), ("STORAGE", 0.005), ("EXTERNAL", 0.02))


@dataclass(frozen=True)
class RankedEngine:
    engine_id: EngineId
    score: float
    reason: str  # e.g. "12/14 blocks cached, 3 waiting, 1 running, kv 41%, prefill ~0.35s, hot-spot damped"
    cached_blocks: int
    predicted_prefill_s: float  # (queued + uncached prompt tokens) / throughput + tier fetch time
    hot_spot_damped: bool
    recent_share: float
    sticky: bool = False
    tier_blocks: tuple[tuple[str, int], ...] = ()
    fetch_s: float = 0.0  # predicted time to fetch tier_blocks


def rank_engines(request: RouteRequest, snapshot: RoutingSnapshot, policy: ScorerPolicy) -> list[RankedEngine]:
    """Eligible engines (healthy, matching class and role), best first. Empty when none is eligible."""
    engines = eligible_engines(request, snapshot.engines)
    if not engines:
        return []
    hot_share = math.inf if policy.engines_share_hardware else policy.hot_spot_factor * mean_share(engines)
    loads = effective_loads(engines, policy)
    ranked = [score_engine(request, engine, policy, hot_share, load) for engine, load in zip(engines, loads)]
    ranked.sort(key=lambda r: (-r.score, r.recent_share, -r.cached_blocks, r.engine_id))
    return apply_session(ranked, snapshot.sessions.get(request.session_id or ""), policy)


def eligible_engines(request: RouteRequest, engines: Sequence[EngineView]) -> list[EngineView]:
    return [
        e
        for e in engines
        if e.healthy
        and (request.class_ref is None or e.class_ref == request.class_ref)
        and (request.roles is None or e.role in request.roles)
    ]


def mean_share(engines: Sequence[EngineView]) -> float:
    return sum(e.recent_share for e in engines) / len(engines)


def score_engine(request: RouteRequest, engine: EngineView, policy: ScorerPolicy, hot_share: float,
                 load_s: float) -> RankedEngine:
    """Score one engine; `hot_share` is the share above which its locality bonus is damped; `load_s` the load
    term to charge (`effective_loads`)."""
    throughput = throughput_of(engine, policy)
    cached_tokens = min(engine.cached_blocks * engine.block_size, request.num_prompt_tokens)
    saved_s = cached_tokens / throughput
    fetch_s = tier_fetch_seconds(engine, policy)
    own_work_s = request.num_prompt_tokens / throughput + fetch_s
    damped = engine.cached_blocks > 0 and engine.recent_share > hot_share
    shared = shared_prefix_factor(request, engine, policy)
    locality = policy.locality_weight * (policy.hot_spot_damping if damped else 1.0) * shared * saved_s
    kv_penalty = policy.kv_full_penalty_s * kv_pressure(engine.kv_cache_usage, policy.kv_soft_limit) ** 2
    score = locality - policy.prefill_weight * own_work_s - load_s - kv_penalty
    predicted_prefill_s = engine.queued_prefill_tokens / throughput + own_work_s - saved_s
    return RankedEngine(
        engine_id=engine.engine_id,
        score=score,
        reason=describe(request, engine, predicted_prefill_s, damped, kv_penalty > 0, shared),
        cached_blocks=engine.cached_blocks,
        predicted_prefill_s=predicted_prefill_s,
        hot_spot_damped=damped,
        recent_share=engine.recent_share,
        tier_blocks=engine.tier_blocks,
        fetch_s=fetch_s,
    )


def throughput_of(engine: EngineView, policy: ScorerPolicy) -> float:
    return engine.prefill_tokens_per_s if engine.prefill_tokens_per_s > 0 else policy.default_prefill_tokens_per_s


def engine_load_s(engine: EngineView, policy: ScorerPolicy) -> float:
    """Seconds of the engine's own queue ahead of a new request: queued prefill work, waiting and running."""
    return (policy.prefill_weight * engine.queued_prefill_tokens / throughput_of(engine, policy)
            + policy.seconds_per_waiting * engine.num_waiting
            + running_cost_s(engine, policy) * engine.num_running)


def effective_loads(engines: Sequence[EngineView], policy: ScorerPolicy) -> list[float]:
    """The load term each engine is charged. Where engines share hardware, their queues draw on the same cores,
    so an engine's load counts `shared_hardware_own_load` of its own and the rest as the pool's mean."""
    own = [engine_load_s(e, policy) for e in engines]
    if not policy.engines_share_hardware or policy.shared_hardware_own_load >= 1.0:
        return own
    pool = sum(own) / len(own)
    weight = policy.shared_hardware_own_load
    return [weight * load + (1.0 - weight) * pool for load in own]


def shared_prefix_factor(request: RouteRequest, engine: EngineView, policy: ScorerPolicy) -> float:
    """min(1, S / p) for the prefix this engine holds (1 when off, unknown, or the engines share hardware)."""
    if policy.shared_prefix_requests <= 0 or policy.engines_share_hardware or engine.cached_blocks <= 0:
        return 1.0
    held = min(engine.cached_blocks, len(request.prefix_requests))
    if held <= 0:
        return 1.0
    popularity = request.prefix_requests[held - 1]
    return min(1.0, policy.shared_prefix_requests / popularity) if popularity > 0 else 1.0


def running_cost_s(engine: EngineView, policy: ScorerPolicy) -> float:
    """Seconds one running decode costs a new request on this engine."""
    if policy.running_cost_steps > 0 and engine.decode_step_s > 0:
        return policy.running_cost_steps * engine.decode_step_s
    return policy.seconds_per_running


def tier_fetch_seconds(engine: EngineView, policy: ScorerPolicy) -> float:
    """Predicted seconds to fetch the engine's tier blocks: measured cost per block, else the policy's default."""
    measured, defaults = dict(engine.tier_fetch_s), dict(policy.default_tier_fetch_s)
    cost = 0.0
    for medium, blocks in engine.tier_blocks:
        per_block = measured.get(medium)
        if per_block is None or per_block < 0:
            per_block = defaults.get(medium, defaults.get("EXTERNAL", 0.0))
        cost += blocks * per_block
    return cost


def kv_pressure(usage: float, soft_limit: float) -> float:
    """0 below the soft limit, rising linearly to 1 at full KV."""
    if usage <= soft_limit:
        return 0.0
    return min(1.0, (usage - soft_limit) / max(1e-9, 1.0 - soft_limit))


def describe(request: RouteRequest, engine: EngineView, prefill_s: float, damped: bool, kv_tight: bool,
             shared: float = 1.0) -> str:
    held = f"{engine.cached_blocks}/{len(request.block_hashes)} blocks cached"
    if engine.tier_blocks:
        held += " (" + ", ".join(f"{n} in {medium}" for medium, n in engine.tier_blocks) + " tier)"
    parts = [
        held,
        f"{engine.num_waiting} waiting",
        f"{engine.num_running} running",
        f"kv {engine.kv_cache_usage:.0%}",
        f"prefill ~{prefill_s:.2f}s",
    ]
    if kv_tight:
        parts.append("kv nearly full")
    if damped:
        parts.append("hot-spot damped")
    if shared < 1.0:
        parts.append(f"shared prefix (x{shared:.2f})")
    return ", ".join(parts)


def apply_session(ranked: list[RankedEngine], session_engine: EngineId | None, policy: ScorerPolicy) -> list[RankedEngine]:
    """Move the session's previous engine to the front when its score is within the margin of the best."""
    if session_engine is None or not ranked or ranked[0].engine_id == session_engine:
        return ranked
    for position, candidate in enumerate(ranked):
        if candidate.engine_id == session_engine:
            if ranked[0].score - candidate.score > policy.session_margin_s:
                return ranked
            sticky = replace(candidate, sticky=True, reason=candidate.reason + ", sticky session")
            return [sticky] + ranked[:position] + ranked[position + 1 :]
    return ranked
