"""Window math over the gateways' cumulative per-revision counters: what was served between two snapshots,
summed over gateways, and the numbers analysis compares (latency quantiles, error and rejection rates).

Counters are cumulative like Prometheus counters; a gateway restart resets them, so a counter (or bucket)
that went down between two snapshots counts as a reset: the window holds what the gateway served since it
restarted, the end snapshot itself. A gateway that is gone at the end contributes nothing.
"""

from __future__ import annotations

from fleetctl.controller.rollout.state import Histogram, ServedByGateway, ServedCounters


def window_delta(start: ServedByGateway, end: ServedByGateway) -> dict[str, ServedCounters]:
    """class_ref -> what every gateway served from it between `start` and `end`."""
    total: dict[str, ServedCounters] = {}
    for gateway, refs in end.items():
        before = start.get(gateway, {})
        for ref, after in refs.items():
            delta = _delta(before.get(ref), after)
            total[ref] = _add(total[ref], delta) if ref in total else delta
    return total


def quantile(histogram: Histogram, q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding rank q * count (bucket lower bound 0
    for the first); a rank in the +Inf bucket answers the largest finite bound. None: no observations."""
    if histogram.count <= 0 or not histogram.bounds:
        return None
    rank = q * histogram.count
    lower, below = 0.0, 0
    for bound, cumulative in zip(histogram.bounds, histogram.counts):
        if cumulative >= rank:
            in_bucket = cumulative - below
            if in_bucket <= 0:
                return bound
            return lower + (bound - lower) * (rank - below) / in_bucket
        lower, below = bound, cumulative
    return histogram.bounds[-1]


def error_rate(c: ServedCounters) -> float | None:
    """Errors over requests; None without requests."""
    return c.errors / c.requests if c.requests > 0 else None


def rejection_rate(c: ServedCounters) -> float | None:
    """Rejections (429s) over requests; None without requests."""
    return c.rejections / c.requests if c.requests > 0 else None


def _delta(before: ServedCounters | None, after: ServedCounters) -> ServedCounters:
    if before is None or _went_down(before, after):
        return after
    return ServedCounters(
        requests=after.requests - before.requests, errors=after.errors - before.errors,
        rejections=after.rejections - before.rejections,
        ttft=_histogram_delta(before.ttft, after.ttft), itl=_histogram_delta(before.itl, after.itl))


def _went_down(before: ServedCounters, after: ServedCounters) -> bool:
    scalars = (after.requests < before.requests or after.errors < before.errors
               or after.rejections < before.rejections)
    return scalars or _histogram_went_down(before.ttft, after.ttft) or _histogram_went_down(before.itl, after.itl)


def _histogram_went_down(before: Histogram, after: Histogram) -> bool:
    if after.count < before.count:
        return True
    if before.bounds and before.bounds != after.bounds:
        return True  # re-bucketed: only a restart does that
    return any(a < b for a, b in zip(after.counts, before.counts))


def _histogram_delta(before: Histogram, after: Histogram) -> Histogram:
    if not before.bounds:
        return Histogram(after.bounds, after.counts, after.count - before.count, after.sum - before.sum)
    return Histogram(after.bounds, tuple(a - b for a, b in zip(after.counts, before.counts)),
                     after.count - before.count, after.sum - before.sum)


def _add(x: ServedCounters, y: ServedCounters) -> ServedCounters:
    return ServedCounters(x.requests + y.requests, x.errors + y.errors, x.rejections + y.rejections,
                          _histogram_add(x.ttft, y.ttft), _histogram_add(x.itl, y.itl))


def _histogram_add(x: Histogram, y: Histogram) -> Histogram:
    if not x.bounds:
        return Histogram(y.bounds, y.counts, x.count + y.count, x.sum + y.sum)
    if not y.bounds:
        return Histogram(x.bounds, x.counts, x.count + y.count, x.sum + y.sum)
    return Histogram(x.bounds, tuple(a + b for a, b in zip(x.counts, y.counts)), x.count + y.count, x.sum + y.sum)
