"""The controller process's moving parts: the store, leader election, the reconcilers and the heartbeat buffer.

`start()` applies migrations (if configured), creates the bootstrap token on first start and starts the
background threads: the reconcilers' loop (reconcile/runner.py: while this process leads, each reconciler
runs on its own schedule) and the heartbeat flusher. The reconcilers are the placement reconciler
(reconciler.py), the canary's verdict reconciler (canary_verdicts.py), the rollout reconciler
(rollout_reconciler.py), the drill reconciler (drill_reconciler.py) and the canary probe reconciler (canary_probes.py)
unless the caller passes others. The API calls `wake()` after changing deployments or nodes
so every reconciler runs at once instead of at its next scheduled time (wakes are coalesced, see runner.py).
Tests drive it without the threads: `step(now)` is one pass of every reconciler.

`watch` is the process's change stream hub (watch_hub.py, `GET /api/v1/watch`): it ticks in a thread of
its own while viewers are connected (with `background`; tests tick it by hand) and is closed on stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from fleetctl.controller import canary_streams, drift
from fleetctl.controller.adoption_reconciler import AdoptedEngineReconciler
from fleetctl.controller.auth import TokenCache, hash_token
from fleetctl.controller.canary_probes import CanaryProbeReconciler
from fleetctl.controller.canary_verdicts import CanaryVerdictReconciler
from fleetctl.controller.db import Store, migrate
from fleetctl.controller.drill_reconciler import DrillReconciler
from fleetctl.controller.flag_reconciler import FlagReconciler
from fleetctl.controller.heartbeats import HeartbeatBuffer
from fleetctl.controller.leader import LeaderElection, election_for
from fleetctl.controller.metrics import ControllerMetrics
from fleetctl.controller.reconcile import Reconciler, ReconcileRunner
from fleetctl.controller.reconciler import PLACEMENT, PlacementReconciler, ReconcileResult
from fleetctl.controller.pd_planner_reconciler import PdPlannerReconciler, PlannerMemory
from fleetctl.controller.rebalance_reconciler import RebalanceReconciler
from fleetctl.controller.rollout_reconciler import RolloutReconciler
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.tokens import ensure_bootstrap_token
from fleetctl.controller.watch_hub import WatchHub

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def default_reconcilers(settings: ControllerSettings, store: Store, metrics: ControllerMetrics | None = None,
                        started_at: datetime | None = None,
                        pd_memory: PlannerMemory | None = None) -> list[Reconciler[Any, Any, Any]]:
    """Expired flag overrides reverted first (the flags gate the others). Placement next, then rollouts:
    deployments a rollout scales are placed at placement's next run. The canary's verdicts before rollouts,
    so a verdict a run folds gates the rollout in the same pass. Then the P:D planner (its `pd_memory` is
    what `pd status` shows) and the rebalance it or an operator started (it holds while a rollout of its
    model runs), drills (those whose time is up are ended), the engines fleetctl adopted (probed, and removed
    once released and drained), and the canary probe reconciler,
    which sends its probes from its own thread (canary_probes.py)."""
    return [FlagReconciler(settings.reconcile_interval_s),
            PlacementReconciler(settings.down_after, settings.reconcile_interval_s),
            CanaryVerdictReconciler(settings),
            RolloutReconciler(settings.reconcile_interval_s, heard_since=started_at),
            PdPlannerReconciler(settings.reconcile_interval_s, pd_memory),
            RebalanceReconciler(settings.reconcile_interval_s, heard_since=started_at),
            DrillReconciler(settings.reconcile_interval_s),
            AdoptedEngineReconciler(),
            CanaryProbeReconciler(settings, store, metrics)]


class ControllerRuntime:
    def __init__(
        self,
        settings: ControllerSettings,
        clock: Callable[[], datetime] = utc_now,
        reconcilers: Sequence[Reconciler[Any, Any, Any]] | None = None,
        timer: Callable[[], float] = time.monotonic,
    ):
        """`clock` is the time decisions are made at (heartbeat ages, audit times); `timer` (monotonic
        seconds) schedules the reconcilers and times their runs."""
        self.settings = settings
        self.clock = clock
        # gateways last heard before this may only have been cut off while the controller was down: their
        # acknowledgements are still waited for a while (gateways.is_awaited)
        self.started_at = clock()
        self.store = Store.from_url(settings.database_url)
        self.election: LeaderElection = election_for(self.store.engine)
        self.env_token_sha256 = hash_token(settings.bootstrap_token) if settings.bootstrap_token else None
        self.tokens = TokenCache(settings.token_cache_s)
        self.metrics = ControllerMetrics()
        self.metrics.watch_drift(self._drift_samples)
        self.metrics.watch_canary(self._canary_samples)
        # None: every heartbeat is written in its own transaction (heartbeat_flush_s = 0)
        self.heartbeats = HeartbeatBuffer(
            self.store, self.wake, clock=clock, on_dropped=self.metrics.count_dropped_heartbeat) if settings.heartbeat_flush_s > 0 else None
        self._wake = threading.Event()  # set: a wake is pending (the runner takes it at its next pass)
        self.pd_memory = PlannerMemory()  # the P:D planner's load readings and latest recommendations
        self.runner = ReconcileRunner(
            self.store, self.election,
            default_reconcilers(settings, self.store, self.metrics, self.started_at, self.pd_memory)
            if reconcilers is None else reconcilers,
            self.metrics, clock=clock, timer=timer, refresh=self.flush_heartbeats, wake=self._wake,
        )
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self.watch = WatchHub(settings, self.store, clock, lambda: self.is_leader, timer, heard_since=self.started_at)
        self.metrics.watch_stream(self._watch_samples)

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    @property
    def passes(self) -> int:
        """Reconcile passes this process ran (as leader)."""
        return self.runner.passes

    def start(self) -> None:
        if self.settings.migrate_on_start:
            migrate(self.store.engine)
        ensure_bootstrap_token(self.store, self.settings.state_dir, self.clock())
        if self.settings.background:
            self.runner.start()
        if self.settings.background and self.heartbeats is not None:
            self._flusher = threading.Thread(target=self._flush_loop, name="fleetctl-heartbeats", daemon=True)
            self._flusher.start()

    def stop(self) -> None:
        self._stop.set()
        self.watch.close()
        self.runner.stop()  # also gives up leadership
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self.flush_heartbeats()  # what was accepted is stored
        self.store.close()

    def wake(self) -> None:
        self.runner.wake()

    def step(self, now: datetime | None = None) -> ReconcileResult | None:
        """One pass of every reconciler: lead if possible; run them if leading. Returns the placement run's
        result; None when following (or without a placement reconciler). Raises what the placement run
        raised, after the other reconcilers ran."""
        report = self.runner.run_all(now)
        if PLACEMENT in report.errors:
            raise report.errors[PLACEMENT]
        placement = report.results.get(PLACEMENT)
        return placement.report if placement is not None else None

    def _drift_samples(self) -> list[tuple[str, str, bool]]:
        """(engine, class_ref, drifted) of every running engine with something to compare (the metric)."""
        with self.store.session() as session:
            return [(e.name, e.class_ref, e.drifted) for e in drift.engine_drift(session) if e.checked]

    def _canary_samples(self) -> list[canary_streams.MetricSample]:
        with self.store.session() as session:
            return canary_streams.metric_samples(session)

    def _watch_samples(self) -> dict[str, float]:
        hub = self.watch
        return {**vars(hub.counters), "viewers": hub.viewers, "history_bytes": hub.history_bytes}

    def flush_heartbeats(self) -> None:
        if self.heartbeats is not None:
            try:
                self.heartbeats.flush()
            except Exception:  # kept queued; the next flush retries (the database may be restarting)
                log.exception("writing heartbeats failed")

    def _flush_loop(self) -> None:
        interval = self.settings.heartbeat_flush_s
        while not self._stop.wait(interval):
            self.flush_heartbeats()
