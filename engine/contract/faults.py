"""Planted faults for canary drills, and the probe extensions of the engine's responses.

A planted fault is a numeric misconfiguration that the engine's reported configuration does not show (the
misconfigured-server case: the class and the config diff look clean; only the answers change). The agent
starts an engine with `FAULT_ENV=<name>` only while a `fleetctl drill plant` is active, and leaves the
variable out of what it reports as the launched environment. The reference engine reads it at start-up.
"""

from __future__ import annotations

from typing import Literal

FAULT_ENV = "FLEET_ENGINE_PLANTED_FAULT"

Fault = Literal["kv_fp16", "kv_bf16", "approx_topk", "rope_perturb"]
FAULTS: dict[str, str] = {
    "kv_fp16": "the KV cache is stored in float16 while the engine reports its configured dtype",
    "kv_bf16": "the KV cache is stored in bfloat16 while the engine reports its configured dtype",
    "approx_topk": "the approximate top-k sampler (wrong near-ties at batch >= 4) while it reports 'exact'",
    "rope_perturb": "RoPE positions scaled by a hidden 1.25 while it reports no scaling",
}

# A request marked with this header (value: 'pinned' or 'production') is a canary probe: the gateway serves
# it like any other but leaves it out of user-facing metrics and the per-class counters rollouts gate on.
PROBE_HEADER = "x-fleet-probe"

# A probe (only a request marked with PROBE_HEADER) may also name the engine it must be served by: the canary
# walks a class's engines in turn, since prefix-cache locality would otherwise send a golden prompt to the
# same engine every time and a planted fault on another engine would go unseen.
PIN_ENGINE_HEADER = "x-fleet-pin-engine"

# The reference engine adds {"fleet": {"batch_size_min": N, "batch_size_max": N}} to a non-streamed
# response: the smallest and largest running batch among the engine steps that computed its tokens.
RESPONSE_EXTENSION = "fleet"
