"""The controller's own Prometheus metrics (GET /metrics), in one registry per controller runtime.

The registry is not prometheus-client's global one: a process may hold several runtimes (tests start many),
and each must count only its own runs. Label values are bounded: `reconciler` is a reconciler's name, fixed
at start.

- `fleet_controller_reconcile_runs_total{reconciler}`: runs started as leader, failed ones included;
- `fleet_controller_reconcile_errors_total{reconciler}`: runs that raised (rolled back, retried with backoff);
- `fleet_controller_reconcile_duration_seconds{reconciler}`: time of each run, snapshot to commit;
- `fleet_controller_heartbeat_dropped_total{reason}`: accepted heartbeats the store refused and that were
  dropped (heartbeats.HeartbeatBuffer); `reason` is the driver's error class.
- `fleet_engine_config_drift{engine, class_ref}`: 1 for a running engine whose config differs from its class
  revision, 0 for one that matches (drift.py); engines with nothing to compare have no series. Read from
  the store at each scrape, so every replica exports the same values.
- `fleet_canary_verdict{model, class, batch}`: each canary stream's verdict, 0 healthy, 1 drifting, 2 failing,
  -1 not measured; `fleet_canary_statistic{model, class, batch}`: its divergence test statistic in count
  units (it alarms at the threshold, docs/canary.md). The production stream is class "*", batch "mixed";
  pinned streams are batch "b1", "b4", ... Read from the stored streams at each scrape.
- the change stream (watch_hub.py), read from the hub's counters at each scrape:
  `fleet_controller_watch_viewers` (connected now), `fleet_controller_watch_ticks_total` and
  `fleet_controller_watch_tick_seconds_total` (builds of the watched resources and the time they took),
  `fleet_controller_watch_tick_errors_total`, `fleet_controller_watch_deltas_total`,
  `fleet_controller_watch_serialisations_total{kind="delta|snapshot"}` (each delta once, each snapshot at
  most once per sequence number, whatever the number of viewers), `fleet_controller_watch_snapshots_sent_total`,
  `fleet_controller_watch_resumes_total`, `fleet_controller_watch_dropped_total` (deltas dropped from the
  history) and `fleet_controller_watch_history_bytes`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

DriftSample = tuple[str, str, bool]  # (engine, class_ref, drifted)
CanarySample = tuple[str, str, str, float, float]  # (model, class, batch, verdict code, statistic)
WatchSample = dict[str, float]  # watch_hub.WatchCounters' fields, `viewers` and `history_bytes`

EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes, as the engines serve it
# A placement pass over a few nodes takes milliseconds; over a thousand, up to seconds.
RECONCILE_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reconcile_runs = Counter("fleet_controller_reconcile_runs", "Reconciler runs started as leader, "
                                      "failed ones included.", ["reconciler"], registry=r)
        self.reconcile_errors = Counter("fleet_controller_reconcile_errors", "Reconciler runs that raised "
                                        "(rolled back; retried with backoff).", ["reconciler"], registry=r)
        self.reconcile_duration = Histogram("fleet_controller_reconcile_duration_seconds", "Duration of one "
                                            "reconciler run, snapshot to commit.", ["reconciler"],
                                            buckets=RECONCILE_DURATION_BUCKETS, registry=r)

        self.heartbeat_dropped = Counter("fleet_controller_heartbeat_dropped", "Accepted heartbeats the store "
                                         "refused, dropped so the others are written.", ["reason"], registry=r)

    def watch_drift(self, read: Callable[[], Iterable[DriftSample]]) -> None:
        """Export `fleet_engine_config_drift` from `read()` at every scrape."""
        self.registry.register(DriftCollector(read))

    def watch_canary(self, read: Callable[[], Iterable[CanarySample]]) -> None:
        """Export `fleet_canary_verdict` and `fleet_canary_statistic` from `read()` at every scrape."""
        self.registry.register(CanaryCollector(read))

    def watch_stream(self, read: Callable[[], WatchSample]) -> None:
        """Export the change stream's `fleet_controller_watch_*` from `read()` at every scrape."""
        self.registry.register(WatchCollector(read))

    def count_dropped_heartbeat(self, reason: str) -> None:
        self.heartbeat_dropped.labels(reason).inc()

    def declare_reconcilers(self, names: Iterable[str]) -> None:
        """Export every reconciler's series from the start, at zero (a missing series reads as 'no data')."""
        for name in names:
            self.reconcile_runs.labels(name)
            self.reconcile_errors.labels(name)
            self.reconcile_duration.labels(name)

    def record_run(self, reconciler: str, duration_s: float, failed: bool) -> None:
        self.reconcile_runs.labels(reconciler).inc()
        self.reconcile_duration.labels(reconciler).observe(duration_s)
        if failed:
            self.reconcile_errors.labels(reconciler).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class DriftCollector:
    """`fleet_engine_config_drift`, computed when scraped (a custom collector: no state to keep in step)."""

    NAME = "fleet_engine_config_drift"
    HELP = "1 when a running engine's config differs from its class revision, 0 when it matches."

    def __init__(self, read: Callable[[], Iterable[DriftSample]]):
        self.read = read

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=["engine", "class_ref"])

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["engine", "class_ref"])
        try:
            samples = list(self.read())
        except Exception:  # the store is down: the other metrics are still served; no series is "no data"
            log.exception("reading engine drift for /metrics failed")
            samples = []
        for engine, class_ref, drifted in samples:
            family.add_metric([engine, class_ref], 1.0 if drifted else 0.0)
        yield family


class CanaryCollector:
    """`fleet_canary_verdict` and `fleet_canary_statistic`, computed when scraped from the stored streams."""

    LABELS = ["model", "class", "batch"]
    VERDICT = ("fleet_canary_verdict", "Canary verdict per stream: 0 healthy, 1 drifting, 2 failing, -1 not measured.")
    STATISTIC = ("fleet_canary_statistic", "Canary divergence test statistic per stream, in count units.")

    def __init__(self, read: Callable[[], Iterable[CanarySample]]):
        self.read = read

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(*self.VERDICT, labels=self.LABELS)
        yield GaugeMetricFamily(*self.STATISTIC, labels=self.LABELS)

    def collect(self) -> Iterator[Metric]:
        verdicts = GaugeMetricFamily(*self.VERDICT, labels=self.LABELS)
        statistics = GaugeMetricFamily(*self.STATISTIC, labels=self.LABELS)
        try:
            samples = list(self.read())
        except Exception:  # the store is down: the other metrics are still served
            log.exception("reading canary streams for /metrics failed")
            samples = []
        for model, class_ref, batch, verdict, statistic in samples:
            verdicts.add_metric([model, class_ref, batch], verdict)
            statistics.add_metric([model, class_ref, batch], statistic)
        yield verdicts
        yield statistics


class WatchCollector:
    """The change stream's counters and gauges, read from its hub when scraped."""

    PREFIX = "fleet_controller_watch_"
    COUNTERS = {
        "ticks": "Builds of the watched resources.",
        "tick_seconds": "Seconds spent building the watched resources.",
        "tick_errors": "Builds that failed (the stream kept its last state).",
        "deltas": "Deltas appended to the change stream's history.",
        "snapshots_sent": "Snapshots sent to viewers (new, unknown or too old tokens, readers that fell behind).",
        "resumes": "Connections that resumed from a token without a snapshot.",
        "dropped": "Deltas dropped from the history to keep it within its size.",
    }
    GAUGES = {"viewers": "Viewers connected to the change stream.",
              "history_bytes": "Bytes of serialised deltas held for viewers that resume or fall behind."}

    def __init__(self, read: Callable[[], WatchSample]):
        self.read = read

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected only when scraped (the hub may be read at any time)

    def collect(self) -> Iterator[Metric]:
        sample = self.read()
        for name, help_text in self.COUNTERS.items():
            family = CounterMetricFamily(self.PREFIX + name, help_text)
            family.add_metric([], sample[name])
            yield family
        serialisations = CounterMetricFamily(self.PREFIX + "serialisations", "Deltas and snapshots serialised "
                                             "(each once, whatever the number of viewers).", labels=["kind"])
        serialisations.add_metric(["delta"], sample["delta_serialisations"])
        serialisations.add_metric(["snapshot"], sample["snapshot_serialisations"])
        yield serialisations
        for name, help_text in self.GAUGES.items():
            yield GaugeMetricFamily(self.PREFIX + name, help_text, value=sample[name])
