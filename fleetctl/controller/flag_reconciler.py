"""The flag reconciler: reverts flag overrides whose TTL ran out (reconcile/protocol.py; flags.py has them).

One run:
1. `snapshot`: the keys of the overrides past their expiry, and when the next of the others expires;
2. `decide` (pure, `decide_reverts`): revert those, and be requeued at the next expiry (at most the
   interval, so an override set through another controller replica is still seen in time);
3. `apply`: flags.end_expired deletes each (one renewed meanwhile is kept) and audits `flag.expired`; then
   the routing generation is stamped so gateways apply the defaults and acknowledge them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from fleetctl.controller import flags, routing_generation, views
from fleetctl.controller.reconcile.protocol import Result

log = logging.getLogger(__name__)

FLAGS = "flags"


@dataclass(frozen=True)
class FlagSnapshot:
    expired: tuple[str, ...]  # keys past their expiry
    next_expiry: datetime | None  # of the overrides still in force


@dataclass(frozen=True)
class RevertDecision:
    revert: tuple[str, ...]
    requeue_after_s: float | None


@dataclass
class FlagReport:
    reverted: list[str] = field(default_factory=list)


def decide_reverts(snapshot: FlagSnapshot, now: datetime) -> RevertDecision:
    wait = (snapshot.next_expiry - now).total_seconds() if snapshot.next_expiry is not None else None
    return RevertDecision(snapshot.expired, None if wait is None else max(wait, 0.0))


class FlagReconciler:
    name = FLAGS

    def __init__(self, interval_s: float):
        self.interval_s = interval_s

    def snapshot(self, session: Session, now: datetime) -> FlagSnapshot:
        return FlagSnapshot(tuple(row.name for row in flags.expired(session, now)), flags.next_expiry(session, now))

    def decide(self, snapshot: FlagSnapshot, now: datetime) -> RevertDecision:
        return decide_reverts(snapshot, now)

    def apply(self, session: Session, decision: RevertDecision, now: datetime) -> Result[FlagReport]:
        report = FlagReport(flags.end_expired(session, list(decision.revert), now))
        if report.reverted:
            routing_generation.stamp(session, lambda: views.routing_content(session))
            log.info("flags: %s back to the default (the TTL ran out)", ", ".join(report.reverted))
        requeue = decision.requeue_after_s
        return Result(report, changed=bool(report.reverted),
                      requeue_after=None if requeue is None else min(requeue, self.interval_s))
