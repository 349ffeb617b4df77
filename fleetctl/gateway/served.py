"""What this gateway served from each class revision, since it started: the counters a rollout's analysis
compares revision B with A on (docs/gateway.md, "Per-revision counters").

Per class_ref, cumulative like Prometheus counters:
- requests: client requests answered once a class was chosen, whatever the status;
- errors: 5xx answers, streams that failed in-band before their first token, and streams cut after it;
- rejections: 429s (admission control, or an engine's own 429 passed on). An API key's rate limit refuses
  a request before a class is chosen, so it is not counted here (fleet_gateway_rate_limited_total has it);
- ttft: seconds from arrival to the first token the client got (streams only, as
  fleet_gateway_ttft_seconds: a non-streamed answer's first token is not seen by the gateway);
- itl: per stream, (last content chunk - first content chunk) / (chunks - 1), one observation per stream
  with at least two content chunks. Non-streamed answers have none: the gateway cannot time their decode.

A request is recorded once, when it finishes, so its count and its latencies land in the same reading.
The same figures are Prometheus metrics labelled by class_ref (fleet_gateway_class_*). Class refs come
from the routing table, and a class that left the table is forgotten (`keep_only`), so labels and the
report stay bounded.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine import metric_names as m
from fleetctl.gateway.metrics import GatewayMetrics

MAX_REPORTED_CLASSES = 256  # the controller refuses a report with more (GatewayReport.served)


@dataclass
class Buckets:
    """A cumulative histogram kept as per-bucket counts (the last one is +Inf)."""

    bounds: tuple[float, ...]
    per_bucket: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.per_bucket:
            self.per_bucket = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.per_bucket[bisect_left(self.bounds, value)] += 1  # bucket i holds bounds[i-1] < v <= bounds[i]
        self.count += 1
        self.sum += value

    def to_json(self) -> dict[str, Any]:
        counts, running = [], 0
        for n in self.per_bucket[:-1]:
            running += n
            counts.append(running)
        return {"bounds": list(self.bounds), "counts": counts, "count": self.count, "sum": self.sum}


@dataclass
class ClassCounters:
    requests: int = 0
    errors: int = 0
    rejections: int = 0
    ttft: Buckets = field(default_factory=lambda: Buckets(tuple(m.TTFT_BUCKETS)))
    itl: Buckets = field(default_factory=lambda: Buckets(tuple(m.ITL_BUCKETS)))

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors, "rejections": self.rejections,
                "ttft": self.ttft.to_json(), "itl": self.itl.to_json()}


@dataclass
class TokenTimes:
    """When a stream's content chunks reached the client: enough for its mean inter-token latency."""

    chunks: int = 0
    first_at: float | None = None
    last_at: float | None = None

    def note(self, chunks: int, now: float) -> None:
        if chunks <= 0:
            return
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        self.chunks += chunks

    def mean_itl(self) -> float | None:
        if self.chunks < 2 or self.first_at is None or self.last_at is None:
            return None
        return max(self.last_at - self.first_at, 0.0) / (self.chunks - 1)


@dataclass(frozen=True)
class Outcome:
    """One finished request, as the counters see it."""

    model: str
    class_ref: str
    code: int  # the status the client got (in-band for a stream that failed before its first token)
    cut: bool = False  # a stream that ended with an error event after tokens were sent
    ttft_s: float | None = None
    itl_s: float | None = None


class ServedRecorder:
    """The per-revision counters of one gateway process, and their Prometheus series."""

    def __init__(self, metrics: GatewayMetrics):
        self.metrics = metrics
        self.classes: dict[str, ClassCounters] = {}
        self._series: dict[str, set[tuple[str, str]]] = {}  # class_ref -> (model, code) label sets exposed

    def record(self, outcome: Outcome) -> None:
        counters = self.classes.setdefault(outcome.class_ref, ClassCounters())
        labels = (outcome.model, outcome.class_ref)
        code = str(outcome.code)
        counters.requests += 1
        self.metrics.class_requests.labels(*labels, code).inc()
        self._series.setdefault(outcome.class_ref, set()).add((outcome.model, code))
        if outcome.code >= 500 or outcome.cut:
            counters.errors += 1
            self.metrics.class_errors.labels(*labels).inc()
        if outcome.code == 429:
            counters.rejections += 1
            self.metrics.class_rejections.labels(*labels).inc()
        if outcome.ttft_s is not None:
            counters.ttft.observe(outcome.ttft_s)
            self.metrics.class_ttft.labels(*labels).observe(outcome.ttft_s)
        if outcome.itl_s is not None:
            counters.itl.observe(outcome.itl_s)
            self.metrics.class_itl.labels(*labels).observe(outcome.itl_s)

    def keep_only(self, class_refs: Iterable[str]) -> None:
        """Forget the classes not in `class_refs` (they left the routing table), and their series."""
        keep = set(class_refs)
        for ref in [r for r in self.classes if r not in keep]:
            del self.classes[ref]
            for model, code in self._series.pop(ref, set()):
                self._remove_series(model, ref, code)

    def _remove_series(self, model: str, ref: str, code: str) -> None:
        with contextlib.suppress(KeyError):
            self.metrics.class_requests.remove(model, ref, code)
        for metric in (self.metrics.class_errors, self.metrics.class_rejections, self.metrics.class_ttft,
                       self.metrics.class_itl):
            with contextlib.suppress(KeyError):
                metric.remove(model, ref)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The report's `served` field: class_ref -> counters (the busiest MAX_REPORTED_CLASSES)."""
        refs: Sequence[str] = sorted(self.classes, key=lambda r: (-self.classes[r].requests, r))
        return {ref: self.classes[ref].to_json() for ref in refs[:MAX_REPORTED_CLASSES]}
