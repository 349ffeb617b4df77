"""Window math over per-revision gateway counters: what class revisions served between two readings, and
the figures analysis compares (quantiles, error and rejection rates). Pure functions over
`state.ServedCounters`; nothing here reads the store or the clock.

Counters are cumulative per gateway, like Prometheus counters, so a window is `end - start`:
- a gateway whose counters went down between the readings restarted: its window counts from zero, i.e. its
  `end` counters (the same rule as Prometheus' `increase()`);
- a gateway missing from `start` (it joined during the window) counts from zero too;
- a gateway missing from `end` contributes nothing (it is gone, or has not reported since the controller
  forgot it). A gateway that stopped reporting still appears in `end` with its last counters, so it simply
  adds nothing new.
Histograms from different gateways are summed at the bucket bounds they share: cumulative counts at a
subset of the bounds stay exact, so a gateway with other buckets coarsens the sum instead of breaking it.
"""

from __future__ import annotations

from fleetctl.controller.rollout.state import Histogram, ServedByGateway, ServedCounters


def window_delta(start: ServedByGateway, end: ServedByGateway) -> dict[str, ServedCounters]:
    """Per class_ref, the sum over gateways of what each served between `start` and `end`. Every class_ref
    found in `end` has an entry (zero counters when nothing was served in the window)."""
    totals: dict[str, ServedCounters] = {}
    for gateway, refs in end.items():
        before = start.get(gateway, {})
        for ref, counters in refs.items():
            delta = counters_delta(before.get(ref), counters)
            totals[ref] = add_counters(totals[ref], delta) if ref in totals else delta
    return totals


def counters_delta(start: ServedCounters | None, end: ServedCounters) -> ServedCounters:
    """`end - start` for one gateway and revision; `end` itself when there is no `start` or it was reset."""
    if start is None or was_reset(start, end):
        return end
    return ServedCounters(
        requests=end.requests - start.requests,
        errors=end.errors - start.errors,
        rejections=end.rejections - start.rejections,
        ttft=histogram_delta(start.ttft, end.ttft),
        itl=histogram_delta(start.itl, end.itl),
    )


def was_reset(start: ServedCounters, end: ServedCounters) -> bool:
    """Whether any counter went down (or a histogram changed its buckets): the gateway restarted."""
    if end.requests < start.requests or end.errors < start.errors or end.rejections < start.rejections:
        return True
    return _histogram_reset(start.ttft, end.ttft) or _histogram_reset(start.itl, end.itl)


def _histogram_reset(start: Histogram, end: Histogram) -> bool:
    if end.count < start.count:
        return True
    if start.count == 0:
        return False  # an empty histogram has nothing to lose, whatever its bounds
    if end.bounds != start.bounds:
        return True
    return any(e < s for s, e in zip(start.counts, end.counts))


def histogram_delta(start: Histogram, end: Histogram) -> Histogram:
    """`end - start` bucket by bucket (the caller has ruled out a reset)."""
    if start.count == 0:
        return end
    counts = tuple(e - s for s, e in zip(start.counts, end.counts))
    return Histogram(end.bounds, counts, end.count - start.count, max(end.sum - start.sum, 0.0))


def add_counters(a: ServedCounters, b: ServedCounters) -> ServedCounters:
    return ServedCounters(a.requests + b.requests, a.errors + b.errors, a.rejections + b.rejections,
                          add_histograms(a.ttft, b.ttft), add_histograms(a.itl, b.itl))


def add_histograms(a: Histogram, b: Histogram) -> Histogram:
    """The sum of two histograms, at the bounds both have (exact for cumulative buckets)."""
    if a.count == 0 and not a.bounds:
        return b
    if b.count == 0 and not b.bounds:
        return a
    if a.bounds == b.bounds:
        counts = tuple(x + y for x, y in zip(a.counts, b.counts))
        return Histogram(a.bounds, counts, a.count + b.count, a.sum + b.sum)
    at_a, at_b = dict(zip(a.bounds, a.counts)), dict(zip(b.bounds, b.counts))
    shared = tuple(sorted(set(at_a) & set(at_b)))
    return Histogram(shared, tuple(at_a[x] + at_b[x] for x in shared), a.count + b.count, a.sum + b.sum)


def quantile(h: Histogram, q: float) -> float | None:
    """The q-quantile (0 <= q <= 1) of a cumulative histogram, as Prometheus' histogram_quantile computes
    it: linear interpolation within the bucket that holds rank q x count (the first bucket's lower edge is
    0, or its bound when that is <= 0); the highest finite bound when the rank falls in the +Inf bucket.
    None when the histogram is empty or has no finite bucket."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    if h.count <= 0 or not h.bounds:
        return None
    rank = q * h.count
    index = _bucket_of(h, rank)
    if index == len(h.bounds):
        return h.bounds[-1]
    upper = h.bounds[index]
    if index == 0 and upper <= 0:
        return upper
    lower, below = (h.bounds[index - 1], h.counts[index - 1]) if index > 0 else (0.0, 0)
    in_bucket = h.counts[index] - below
    return lower + (upper - lower) * (rank - below) / in_bucket


def _bucket_of(h: Histogram, rank: float) -> int:
    """The first bucket whose cumulative count reaches `rank` and that holds an observation (so rank 0
    lands in the first non-empty bucket, not on an empty one); len(bounds) for the +Inf bucket."""
    for index, cumulative in enumerate(h.counts):
        if cumulative >= rank and cumulative > (h.counts[index - 1] if index > 0 else 0):
            return index
    return len(h.bounds)


def error_rate(c: ServedCounters) -> float | None:
    """Errors per request answered; None when there were no requests."""
    return c.errors / c.requests if c.requests > 0 else None


def rejection_rate(c: ServedCounters) -> float | None:
    """Rejections (429) per request answered; None when there were no requests."""
    return c.rejections / c.requests if c.requests > 0 else None

