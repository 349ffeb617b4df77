"""The adopted engines' reconciler: probes every engine fleetctl adopted (adoption.py) each
PROBE_INTERVAL_S, records its state and load, and removes those released once they have drained.

snapshot: the adopted engines and, for each, a probe of it (the I/O: HTTP to the engines, each request
bounded by adoption.PROBE_TIMEOUT_S); decide (pure): which are released; apply: removes those, and writes the
others' state (adoption.next_state of the row as it is then, so a release made meanwhile holds) and load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import httpx
from sqlalchemy.orm import Session

from fleetctl.controller import adoption
from fleetctl.controller.adoption import EngineProbe
from fleetctl.controller.models import AdoptedEngine
from fleetctl.controller.reconcile.protocol import Result

ADOPTED_ENGINES = "adopted-engines"


@dataclass(frozen=True)
class AdoptedSnapshot:
    states: dict[str, tuple[str, datetime | None]] = field(default_factory=dict)  # name -> (state, draining since)
    probes: dict[str, EngineProbe] = field(default_factory=dict)


@dataclass(frozen=True)
class AdoptedDecision:
    released: tuple[str, ...] = ()
    probes: dict[str, EngineProbe] = field(default_factory=dict)


@dataclass(frozen=True)
class AdoptedReport:
    probed: int
    released: list[str]
    changed: list[str]


class AdoptedEngineReconciler:
    name = ADOPTED_ENGINES
    interval_s = adoption.PROBE_INTERVAL_S

    def __init__(self, http: httpx.Client | None = None):
        self._http = http

    @property
    def http(self) -> httpx.Client:
        """Made on first use: most fleets adopt no engine, and a client costs a TLS context (~20 ms) to make."""
        if self._http is None:
            self._http = httpx.Client()
        return self._http

    def snapshot(self, session: Session, now: datetime) -> AdoptedSnapshot:
        rows = adoption.adopted_engines(session)
        if not rows:
            return AdoptedSnapshot()
        specs = {ref: adoption.class_spec(session, ref) for ref in {row.class_ref for row in rows}}
        probes = adoption.probe_all(self.http, [(r.name, r.url, specs[r.class_ref].backend) for r in rows])
        return AdoptedSnapshot({r.name: (r.state, r.draining_since) for r in rows}, probes)

    def decide(self, snapshot: AdoptedSnapshot, now: datetime) -> AdoptedDecision:
        released = tuple(name for name, (state, since) in snapshot.states.items()
                         if adoption.releasable(state, since, snapshot.probes[name], now))
        return AdoptedDecision(released, snapshot.probes)

    def apply(self, session: Session, decision: AdoptedDecision, now: datetime) -> Result[AdoptedReport]:
        changed, released = [], []
        for name, probe in decision.probes.items():
            row = session.get(AdoptedEngine, name)
            if row is None:  # released meanwhile
                continue
            if name in decision.released:
                session.delete(row)
                released.append(name)
                continue
            state = adoption.next_state(row.state, probe)  # the row's: a release since the snapshot holds
            if state != row.state:
                changed.append(name)
            row.state, row.checked_at, row.last_error = state, now, probe.error
            if probe.metrics is not None:
                row.metrics = probe.metrics
        # a state change or a release changes the routing table
        return Result(AdoptedReport(len(decision.probes), released, changed), changed=bool(changed or released))

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
