"""Workloads from the real traces in ../shared/traces (see its README): what arrives, when, how long.

- `load_azure_trace(path)`: the Azure 2023 LLM inference trace rows (arrival, context and generated tokens).
- `trace_slice(rows, start_s, length_s, rate, scaling)`: a window of the trace as it happened, arrivals
  compressed `rate` times, lengths scaled down by `LengthScaling` so a small (CPU) engine model serves it.
- `sampled_workload(rows, rate_rps, duration_s, scaling, seed)`: Poisson arrivals at `rate_rps` with
  lengths drawn from the trace's joint (prompt, output) distribution; the same seed gives the same workload.
- `one_after_another(first, second, at_s)`: two workloads as one, the second starting at `at_s`.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetctl.sim.requests import RequestSpec

TRACES_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "traces"  # beside the repository
AZURE_CONV = "azure_llm_2023_conv.csv"


@dataclass(frozen=True)
class TraceRow:
    t_s: float  # seconds since the trace's first row
    context_tokens: int
    generated_tokens: int


@dataclass(frozen=True)
class LengthScaling:
    """How trace lengths become simulated ones: prompt = context / prompt_scale, output = generated /
    output_scale (each rounded, at least 1), max_tokens = ceil(output x max_tokens_factor)."""

    prompt_scale: float = 8.0
    output_scale: float = 4.0
    max_tokens_factor: float = 1.0  # > 1: clients ask for more tokens than they will get

    def request(self, request_id: int, arrival_s: float, row: TraceRow) -> RequestSpec:
        prompt = max(1, round(row.context_tokens / self.prompt_scale))
        output = max(1, round(row.generated_tokens / self.output_scale))
        return RequestSpec(request_id, arrival_s, prompt, output, max(1, math.ceil(output * self.max_tokens_factor)))


def load_azure_trace(path: Path = TRACES_DIR / AZURE_CONV) -> list[TraceRow]:
    """The rows of an Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens), in file order."""
    stamped = []
    with open(path) as f:
        for row in csv.DictReader(f):
            stamp = dt.datetime.strptime(row["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f")  # to microseconds
            stamped.append((stamp, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    t0 = stamped[0][0]
    return [TraceRow((t - t0).total_seconds(), c, g) for t, c, g in stamped]


def trace_slice(rows: Sequence[TraceRow], start_s: float, length_s: float, rate: float,
                scaling: LengthScaling) -> list[RequestSpec]:
    """The rows arriving in [start_s, start_s + length_s), at `rate` x their speed, from time 0."""
    window = [r for r in rows if start_s <= r.t_s < start_s + length_s]
    return [scaling.request(i, (row.t_s - start_s) / rate, row) for i, row in enumerate(window)]


def sampled_workload(rows: Sequence[TraceRow], rate_rps: float, duration_s: float, scaling: LengthScaling,
                     seed: int) -> list[RequestSpec]:
    """Poisson arrivals at `rate_rps` over [0, duration_s), each with the lengths of a random trace row."""
    if rate_rps <= 0 or not rows:
        return []
    rng = random.Random(seed)
    requests: list[RequestSpec] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s:
        requests.append(scaling.request(len(requests), t, rng.choice(rows)))
        t += rng.expovariate(rate_rps)
    return requests


def one_after_another(first: Sequence[RequestSpec], second: Sequence[RequestSpec], at_s: float) -> list[RequestSpec]:
    """`first`, then `second` with its arrivals moved `at_s` later and its ids following `first`'s."""
    return [*first, *(RequestSpec(len(first) + i, at_s + r.arrival_s, r.prompt_tokens, r.output_tokens, r.max_tokens)
                      for i, r in enumerate(second))]
