"""What one engine does within the SLOs, from a sweep's measured points: the figures the planner divides by.
Pure; the sweep itself (fleetctl/cli/pd_profile.py, benchmarks/pd_profile.py) sends the requests.

- Prefill: rounds of `concurrency` simultaneous prompts, each unique (no prefix-cache hit) and asking for
  one token. A point's throughput is the round's prompt tokens over its wall time; its TTFT p90 is over the
  requests. The engine's prefill tokens/s is the best throughput of a point whose TTFT p90 is within the
  SLO (Dynamo's profiler picks the same way); when none is, the lowest-concurrency point's, flagged.
- Decode: `concurrency` simultaneous streams of `output_tokens` each. A point's ITL p90 is over the
  streams' mean inter-token gaps. The engine's decode slots are the highest concurrency whose ITL p90 is
  within the SLO, and its ITL is that point's ITL p90 (often well under the SLO when the sweep's top
  concurrency, or the engine's max_num_seqs, is what stops it); when even one stream is over the SLO, the
  fraction of a slot the SLO allows (slo / ITL at 1), at the SLO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillPoint:
    concurrency: int
    tokens_per_s: float
    ttft_p90_s: float


@dataclass(frozen=True)
class DecodePoint:
    concurrency: int
    itl_p90_s: float
    tokens_per_s: float


@dataclass(frozen=True)
class Fit:
    prefill_tokens_per_s: float
    decode_slots: float
    decode_itl_s: float  # the ITL p90 at decode_slots
    notes: tuple[str, ...]


def p90(values: Sequence[float]) -> float:
    """The nearest-rank 90th percentile (exact for the small samples a sweep takes)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(0, min(len(ordered) - 1, -(-9 * len(ordered) // 10) - 1))
    return ordered[rank]


def fit(prefill: Sequence[PrefillPoint], decode: Sequence[DecodePoint], ttft_slo_s: float, itl_slo_s: float) -> Fit:
    if not prefill or not decode:
        raise ValueError("a fit needs at least one prefill and one decode point")
    notes = []
    within = [p for p in prefill if p.ttft_p90_s <= ttft_slo_s]
    if within:
        best = max(within, key=lambda p: p.tokens_per_s)
        notes.append(f"prefill: {best.tokens_per_s:.0f} tok/s at concurrency {best.concurrency} "
                     f"(TTFT p90 {best.ttft_p90_s:.3f} s <= {ttft_slo_s:g} s)")
    else:
        best = min(prefill, key=lambda p: p.concurrency)
        notes.append(f"prefill: no point within the TTFT SLO {ttft_slo_s:g} s; {best.tokens_per_s:.0f} tok/s at "
                     f"concurrency {best.concurrency} (TTFT p90 {best.ttft_p90_s:.3f} s)")
    fitting = [d for d in decode if d.itl_p90_s <= itl_slo_s]
    if fitting:
        top = max(fitting, key=lambda d: d.concurrency)
        slots, itl = float(top.concurrency), top.itl_p90_s
        notes.append(f"decode: {top.concurrency} slots (ITL p90 {top.itl_p90_s:.4f} s <= {itl_slo_s:g} s)")
    else:
        one = min(decode, key=lambda d: d.concurrency)
        slots, itl = round(itl_slo_s / one.itl_p90_s * one.concurrency, 3), itl_slo_s
        notes.append(f"decode: even {one.concurrency} stream(s) exceed the ITL SLO {itl_slo_s:g} s "
                     f"(ITL p90 {one.itl_p90_s:.4f} s): {slots:g} slots")
    return Fit(best.tokens_per_s, slots, itl, tuple(notes))
