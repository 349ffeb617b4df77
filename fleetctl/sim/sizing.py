"""Size a P/D fleet so a workload's mean offered work is a chosen multiple of its capacity.

Prefill capacity is `prefill_tokens_per_s` per engine; decode capacity is a full batch: `max_num_seqs`
tokens per `step_s(max_num_seqs)` per engine. Engine counts are rounded to the nearest whole engine (at
least one), so the achieved overload is reported beside the asked one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetctl.sim.engines import EngineConstants
from fleetctl.sim.requests import RequestSpec


@dataclass(frozen=True)
class FleetSizing:
    n_prefill: int
    n_decode: int
    prefill_demand_tokens_per_s: float  # offered prompt tokens per second of the run
    decode_demand_tokens_per_s: float  # offered output tokens per second
    prefill_capacity_tokens_per_s: float
    decode_capacity_tokens_per_s: float
    prefill_overload: float  # demand / capacity, as achieved with whole engines
    decode_overload: float


def size_for_overload(workload: Sequence[RequestSpec], duration_s: float, constants: EngineConstants,
                      max_num_seqs: int, prefill_overload: float, decode_overload: float) -> FleetSizing:
    prefill_demand = sum(r.prompt_tokens for r in workload) / duration_s
    decode_demand = sum(r.output_tokens for r in workload) / duration_s
    decode_capacity = max_num_seqs / constants.step_s(max_num_seqs)  # tokens/s of one full engine
    n_prefill = max(1, round(prefill_demand / constants.prefill_tokens_per_s / prefill_overload))
    n_decode = max(1, round(decode_demand / decode_capacity / decode_overload))
    return FleetSizing(
        n_prefill=n_prefill,
        n_decode=n_decode,
        prefill_demand_tokens_per_s=prefill_demand,
        decode_demand_tokens_per_s=decode_demand,
        prefill_capacity_tokens_per_s=n_prefill * constants.prefill_tokens_per_s,
        decode_capacity_tokens_per_s=n_decode * decode_capacity,
        prefill_overload=prefill_demand / (n_prefill * constants.prefill_tokens_per_s),
        decode_overload=decode_demand / (n_decode * decode_capacity),
    )
