"""Whether to copy a popular prefix onto an idle engine before a request needs it there.

A cache-aware scorer prices a miss by the prefill it costs this request, so a prefix held by one engine
keeps its traffic there: sending the next request to an idle engine would make that request prefill the
whole prefix cold. On engines with hardware of their own (GPU replicas, or pinned cores) that leaves one
engine queueing while another idles: on benchmarks/routing.py's system-prompt shape the gateway put 65% of
the requests on the engine that held the busiest tenant's prompt, and round-robin, which pays each prompt's
cold prefill once per engine and then splits evenly, had the lower P90 (docs/benchmarks.md).

Warming pays that cold prefill where no request waits for it: when a request's leading blocks are popular
(at least `min_prefix_requests` recent requests began with them, prefix_popularity.py) and an eligible engine
that holds fewer of them has nothing running, queued or waiting, the gateway sends that engine the prefix
alone (its token ids, one output token). From then on both engines hold it, and the scorer's load terms
decide between them as between equals.

Off where engines share hardware: there an idle engine's cores are the busy one's, and the warm prefill
would slow the very requests it is meant to spare. `min_prefix_requests` 0 turns it off. The defaults (8
recent requests, 4 blocks): on benchmarks/routing.py's independent testbed warming lowered the system
prompt's P90 by a fifth, and fired never on agent sessions and once in three runs on RAG (their popular
prefixes are short, or already on both engines); in fleetctl/sim, at 2 to 64 engines, its P90 was as low or
lower on every shape and size but one (RAG at 4 engines, 3% higher) (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fleetctl.gateway.prefix_index import EngineId
from fleetctl.gateway.scorer import EngineView, RouteRequest, ScorerPolicy, eligible_engines


@dataclass(frozen=True)
class WarmPolicy:
    min_prefix_requests: float = 8.0  # a prefix this many recent requests began with is warmed; 0: off
    min_blocks: int = 4  # shorter popular prefixes are cheap to recompute: not worth a request of their own


@dataclass(frozen=True)
class WarmPlan:
    engine_id: EngineId  # the idle engine to prefill the prefix on
    blocks: int  # leading blocks of the request's prompt to send
    cached_blocks: int  # of those, what the engine already holds (its prefill is the rest)
    prefix_requests: float  # recent requests that began with the warmed prefix


def counts_popularity(scorer: ScorerPolicy, warm: WarmPolicy) -> bool:
    """Whether recent requests per prefix (prefix_popularity.py) need counting: only the scorer's shared-prefix
    price and warming read them, and both are off where engines share hardware."""
    return not scorer.engines_share_hardware and (scorer.shared_prefix_requests > 0 or warm.min_prefix_requests > 0)


def popular_blocks(prefix_requests: Sequence[float], min_prefix_requests: float) -> int:
    """Leading blocks of a prompt that at least `min_prefix_requests` recent requests began with."""
    count = 0
    for requests in prefix_requests:
        if requests < min_prefix_requests:
            break
        count += 1
    return count


def is_idle(engine: EngineView) -> bool:
    return engine.num_running == 0 and engine.num_waiting == 0 and engine.queued_prefill_tokens == 0


def plan_warm(request: RouteRequest, chosen: EngineId, engines: Sequence[EngineView], warming: Collection[EngineId],
              policy: WarmPolicy, engines_share_hardware: bool) -> WarmPlan | None:
    """The engine to warm with this request's popular prefix, or None.

    `chosen` is the engine the request itself goes to; `warming` the engines with a warm still in flight (one
    at a time each). Among the eligible idle engines holding less of the prefix, the least recently used
    (lowest recent share) is warmed."""
    if policy.min_prefix_requests <= 0 or engines_share_hardware:
        return None
    blocks = popular_blocks(request.prefix_requests, policy.min_prefix_requests)
    if blocks < max(1, policy.min_blocks):
        return None
    targets = [
        e for e in eligible_engines(request, engines)
        if e.engine_id != chosen and e.engine_id not in warming and e.role != "decode"
        and e.cached_blocks < blocks and is_idle(e)
    ]
    if not targets:
        return None
    target = min(targets, key=lambda e: (e.recent_share, e.cached_blocks, e.engine_id))
    return WarmPlan(target.engine_id, blocks, target.cached_blocks, request.prefix_requests[blocks - 1])
