"""Snapshots for the pure decisions: the scorer's `EngineView` and admission's `EngineLoad`, built from an
engine's routing-table entry, the gateway's live view of it (engine_state.EngineLive) and its class spec.

Throughput and step time are estimated per CLASS (every engine of a class runs the same configuration), so
identical engines are priced identically and the scorer's tie-breaks (recent share) decide between them,
rather than the noise of each engine's own few measurements.

What the gateway does not know about other clients' requests it estimates conservatively:
- requests waiting on the engine that are not ours count `others_prompt_tokens` prompt tokens each (the
  mean prompt of the gateway's recent requests) towards the prefill queue;
- requests running on the engine that are not ours are decodes with `others_remaining_tokens` still to go.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetctl.gateway.admission import EngineLoad, RunningDecode
from fleetctl.gateway.engine_state import EngineLive
from fleetctl.gateway.prefix_index import PrefixHit
from fleetctl.gateway.routing_table import EngineRoute
from fleetctl.gateway.scorer import EngineView
from fleetctl.replica_class import ReplicaClassSpec

UNKNOWN_KV_HEADROOM_TOKENS = 1 << 40  # an engine whose pool size we cannot read never fails the KV check


@dataclass(frozen=True)
class Estimates:
    prefill_tokens_per_s: float = 2000.0  # the class's measured throughput, else the configured default
    decode_step_s: float = 0.02  # the class's measured inter-token latency, else the configured default
    others_prompt_tokens: int = 0
    others_remaining_tokens: int = 128


def engine_view(route: EngineRoute, live: EngineLive, spec: ReplicaClassSpec, hit: PrefixHit,
                recent_share: float, estimates: Estimates) -> EngineView:
    return EngineView(
        engine_id=route.name,
        role=route.role,
        class_ref=route.class_ref,
        healthy=live.healthy and route.routable,
        num_running=live.num_running,
        num_waiting=live.num_waiting,
        kv_cache_usage=live.kv_cache_usage,
        queued_prefill_tokens=queued_prefill_tokens(live, estimates),
        prefill_tokens_per_s=estimates.prefill_tokens_per_s,
        cached_blocks=hit.blocks,
        recent_share=recent_share,
        block_size=block_size_of(live, spec),
        tier_blocks=hit.tier_blocks,
        tier_fetch_s=live.sample.tier_fetch_s if live.sample is not None else (),
        decode_step_s=estimates.decode_step_s,
    )


def queued_prefill_tokens(live: EngineLive, estimates: Estimates) -> int:
    return live.own_queued_prefill_tokens + live.others_waiting * estimates.others_prompt_tokens


def block_size_of(live: EngineLive, spec: ReplicaClassSpec) -> int:
    """The engine's own block size when its metrics say, else the class's."""
    if live.sample is not None and live.sample.block_size:
        return live.sample.block_size
    return spec.block_size


def engine_load(route: EngineRoute, live: EngineLive, spec: ReplicaClassSpec, estimates: Estimates) -> EngineLoad:
    running = [
        RunningDecode(remaining_tokens=max(0, t.max_tokens - t.generated), kv_tokens=t.prompt_tokens + t.generated)
        for t in live.inflight.values()
        if not t.prefilling and t.role != "prefill"
    ]
    running += [RunningDecode(remaining_tokens=estimates.others_remaining_tokens)] * live.others_running
    return EngineLoad(
        engine_id=route.name,
        role=route.role,
        queued_prefill_tokens=queued_prefill_tokens(live, estimates),
        prefill_tokens_per_s=estimates.prefill_tokens_per_s,
        admitted_ahead=live.own_prefilling + live.others_waiting,
        running=tuple(running),
        max_num_seqs=spec.max_num_seqs,
        decode_step_s=estimates.decode_step_s,
        kv_headroom_tokens=kv_headroom_tokens(live),
    )


def kv_headroom_tokens(live: EngineLive) -> int:
    capacity = live.sample.kv_capacity_tokens if live.sample is not None else None
    if capacity is None:
        return UNKNOWN_KV_HEADROOM_TOKENS
    return int((1.0 - live.kv_cache_usage) * capacity)
