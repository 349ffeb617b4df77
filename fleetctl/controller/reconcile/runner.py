"""The reconciler runner: runs the controller's reconcilers while this process leads, each on its schedule.

One pass (`run_due`, or `run_all` for every reconciler regardless of schedule):
1. a pending wake makes every reconciler due (schedule.py);
2. leadership is checked (leader.py); a follower runs nothing;
3. `refresh` runs (the runtime writes its queued heartbeats, so node liveness is as this controller heard it);
4. each due reconciler runs in its own session: snapshot, decide, apply. One that raises is rolled back,
   logged, counted and backed off; the others run as if nothing happened;
5. if any run changed the store, `refresh` runs again (agents' cached replies pick up new assignments now,
   not at the next periodic flush); if a run asked to wake the others (`Result.wake`: it changed what they
   read), the next pass runs every reconciler.
Passes never overlap (one lock: the loop and callers of `run_due`/`run_all` take turns). Every run is
counted in the metrics (metrics.py) under its reconciler's name.

A reconciler that keeps work running between its runs (the canary probe reconciler's executor) may define
`on_leadership_lost()`, called at the first pass that finds this process no longer leading, and `close()`,
called when the runner stops.

The background loop (`start`/`stop`) sleeps until the first reconciler is due or a wake arrives. Wakes are
coalesced: the next pass starts no sooner than 3x the last pass's duration after it ended (at most the
shortest interval). A pass reads the whole fleet, and a heartbeat from a node that was down wakes the loop,
so after an outage (or while an overloaded controller sees nodes go down and come back) wakes arrive once
per node; this keeps the reconcilers to about a quarter of the process's time instead of all of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleetctl.controller.db import Store
from fleetctl.controller.leader import LeaderElection
from fleetctl.controller.metrics import ControllerMetrics
from fleetctl.controller.reconcile.protocol import Reconciler, Result
from fleetctl.controller.reconcile.schedule import (
    Schedule,
    after_failure,
    after_success,
    is_due,
    seconds_until_due,
    woken,
)

log = logging.getLogger(__name__)

COALESCE_FACTOR = 3  # the loop rests this many times a pass's duration before the next (see above)
STOP_TIMEOUT_S = 10.0


@dataclass
class PassReport:
    """What one pass did. A follower's pass ran nothing (`leading` False)."""

    leading: bool
    results: dict[str, Result[Any]] = field(default_factory=dict)  # reconciler name -> its run's result
    errors: dict[str, Exception] = field(default_factory=dict)  # reconciler name -> what its run raised

    @property
    def changed(self) -> bool:
        return any(result.changed for result in self.results.values())


class ReconcileRunner:
    def __init__(
        self,
        store: Store,
        election: LeaderElection,
        reconcilers: Sequence[Reconciler[Any, Any, Any]],
        metrics: ControllerMetrics,
        clock: Callable[[], datetime],
        timer: Callable[[], float] = time.monotonic,
        refresh: Callable[[], None] = lambda: None,
        wake: threading.Event | None = None,
    ):
        """`refresh` runs before a pass reads the store and after a pass changed it; `wake` is the event
        that `wake()` sets (the caller's own, when it wants to see or clear pending wakes)."""
        names = [r.name for r in reconcilers]
        if len(set(names)) != len(names):
            raise ValueError(f"reconciler names must be unique: {names}")
        self.store = store
        self.election = election
        self.reconcilers = tuple(reconcilers)
        self.metrics = metrics
        self.clock = clock  # the `now` reconcilers decide with
        self.timer = timer  # monotonic seconds: schedules and durations
        self.refresh = refresh
        self.passes = 0  # passes that ran at least one reconciler (as leader)
        self._schedules = {r.name: Schedule(r.interval_s) for r in reconcilers}
        self._rest_cap_s = min((r.interval_s for r in reconcilers), default=1.0)
        self._pass_lock = threading.Lock()
        self._wake = wake or threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = False  # as of the last pass
        metrics.declare_reconcilers(names)

    def schedule(self, name: str) -> Schedule:
        return self._schedules[name]

    def wake(self) -> None:
        """Run every reconciler at the next pass (the loop's next pass starts at once, coalesced)."""
        self._wake.set()

    def run_due(self, now: datetime | None = None) -> PassReport:
        """One pass of the reconcilers that are due."""
        return self._pass(now, only_due=True)

    def run_all(self, now: datetime | None = None) -> PassReport:
        """One pass of every reconciler, due or not."""
        return self._pass(now, only_due=False)

    def _pass(self, now: datetime | None, only_due: bool) -> PassReport:
        with self._pass_lock:
            self._take_wake()
            if not self.election.ensure():
                if self._leading:
                    self._leading = False
                    self._notify("on_leadership_lost")
                return PassReport(leading=False)
            self._leading = True
            at = self.timer()
            due = [r for r in self.reconcilers if not only_due or is_due(self._schedules[r.name], at)]
            report = PassReport(leading=True)
            if not due:
                return report
            self.refresh()
            when = now or self.clock()
            for reconciler in due:
                self._run_one(reconciler, when, report)
            self.passes += 1
        if report.changed:
            self.refresh()
        if any(result.wake for result in report.results.values()):
            self.wake()
        return report

    def _take_wake(self) -> None:
        # Taken before the leadership check: a follower forgets the wake (it would otherwise spin the loop),
        # and every reconciler is due when it leads.
        if self._wake.is_set():
            self._wake.clear()
            self._schedules = {name: woken(s) for name, s in self._schedules.items()}

    def _run_one(self, reconciler: Reconciler[Any, Any, Any], now: datetime, report: PassReport) -> None:
        name = reconciler.name
        started = self.timer()
        try:
            with self.store.session() as session:
                decision = reconciler.decide(reconciler.snapshot(session, now), now)
                result = reconciler.apply(session, decision, now)
        except Exception as exc:  # isolated: the other reconcilers run; this one is retried with backoff
            ended = self.timer()
            self._schedules[name] = after_failure(self._schedules[name], ended)
            report.errors[name] = exc
            schedule = self._schedules[name]
            log.exception("reconciler %s failed (%d in a row); retrying in %.1f s", name, schedule.failures,
                          (schedule.next_run_at or ended) - ended)
        else:
            ended = self.timer()
            self._schedules[name] = after_success(self._schedules[name], ended, result.requeue_after)
            report.results[name] = result
        self.metrics.record_run(name, ended - started, failed=name in report.errors)

    # --- the background loop ---

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fleetctl-reconcilers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop (after the pass in progress) and give up leadership."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)
        with self._pass_lock:
            self.election.release()
            self._leading = False
            self._notify("close")

    def _notify(self, hook: str) -> None:
        """Call `hook` on every reconciler that has it; one that raises is logged, the others still run."""
        for reconciler in self.reconcilers:
            method = getattr(reconciler, hook, None)
            if method is None:
                continue
            try:
                method()
            except Exception:
                log.exception("reconciler %s: %s failed", reconciler.name, hook)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = self.timer()
            try:
                report: PassReport | None = self.run_due()
            except Exception:  # the loop must survive a bad pass (DB restart, race); the next one retries
                log.exception("reconcile pass failed")
                report = None
            took = self.timer() - started
            self._wake.wait(self._seconds_to_next_pass(report))
            rest = min(COALESCE_FACTOR * took, self._rest_cap_s) - (self.timer() - started - took)
            if rest > 0:
                self._stop.wait(rest)

    def _seconds_to_next_pass(self, report: PassReport | None) -> float:
        if report is None or not report.leading:
            return self._rest_cap_s  # a follower tries to lead again after the shortest interval
        wait = seconds_until_due(self._schedules.values(), self.timer())
        return self._rest_cap_s if wait is None else wait
