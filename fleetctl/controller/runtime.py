"""The controller process's moving parts: the store, leader election and the reconcile loop.

`start()` applies migrations (if configured), creates the bootstrap token on first start and starts the
background thread; each loop pass tries to lead and, when leading, reconciles. The API calls `wake()`
after changing deployments or nodes so the next pass runs at once instead of after the interval (wakes
during or just after a pass are coalesced into one pass, see `_loop`).
Tests drive it without the thread: `step(now)` is one pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

from fleetctl.controller.auth import TokenCache, hash_token
from fleetctl.controller.db import Store, migrate
from fleetctl.controller.heartbeats import HeartbeatBuffer
from fleetctl.controller.leader import LeaderElection, election_for
from fleetctl.controller.reconciler import ReconcileResult, reconcile_once
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.tokens import ensure_bootstrap_token

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class ControllerRuntime:
    def __init__(self, settings: ControllerSettings, clock: Callable[[], datetime] = utc_now):
        self.settings = settings
        self.clock = clock
        self.store = Store.from_url(settings.database_url)
        self.election: LeaderElection = election_for(self.store.engine)
        self.env_token_sha256 = hash_token(settings.bootstrap_token) if settings.bootstrap_token else None
        self.tokens = TokenCache(settings.token_cache_s)
        # None: every heartbeat is written in its own transaction (heartbeat_flush_s = 0)
        self.heartbeats = HeartbeatBuffer(self.store, self.wake, clock=clock) if settings.heartbeat_flush_s > 0 else None
        self.passes = 0  # reconcile passes this process ran (as leader)
        self._pass_lock = threading.Lock()  # one pass at a time (the loop, and tests calling step())
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flusher: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def start(self) -> None:
        if self.settings.migrate_on_start:
            migrate(self.store.engine)
        ensure_bootstrap_token(self.store, self.settings.state_dir, self.clock())
        if self.settings.background:
            self._thread = threading.Thread(target=self._loop, name="fleetctl-reconciler", daemon=True)
            self._thread.start()
        if self.settings.background and self.heartbeats is not None:
            self._flusher = threading.Thread(target=self._flush_loop, name="fleetctl-heartbeats", daemon=True)
            self._flusher.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self.flush_heartbeats()  # what was accepted is stored
        with self._pass_lock:
            self.election.release()
        self.store.close()

    def wake(self) -> None:
        self._wake.set()

    def step(self, now: datetime | None = None) -> ReconcileResult | None:
        """One pass: lead if possible; reconcile if leading. None when following."""
        with self._pass_lock:
            if not self.election.ensure():
                return None
            self.flush_heartbeats()  # node liveness as this controller last heard it
            with self.store.session() as session:
                result = reconcile_once(session, now or self.clock(), self.settings.down_after)
            self.passes += 1
        if result.changed or result.marked_down:
            self.flush_heartbeats()  # the cached replies pick up the new assignments now, not at the next flush
            log.info("reconcile: assignments changed on %d node(s), %d node(s) marked down",
                     len(result.changed), len(result.marked_down))
        return result

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

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            started = time.monotonic()
            try:
                self.step()
            except Exception:  # the loop must survive a bad pass (DB restart, race); the next one retries
                log.exception("reconcile pass failed")
            took = time.monotonic() - started
            self._wake.wait(self.settings.reconcile_interval_s)
            # Wakes are coalesced: the next pass starts no sooner than 3x this pass's duration after it ended.
            # A pass reads the whole fleet, and a heartbeat from a node that was down wakes the loop, so after an
            # outage (or while an overloaded controller sees nodes go down and come back) wakes arrive once per
            # node; this keeps the reconciler to about a quarter of the process's time instead of all of it.
            rest = min(3 * took, self.settings.reconcile_interval_s) - (time.monotonic() - started - took)
            if rest > 0:
                self._stop.wait(rest)
