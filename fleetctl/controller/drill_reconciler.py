"""The drill reconciler: ends canary drills whose time is up (reconcile/protocol.py; drills.py has the drills).

One run:
1. `snapshot`: every drill in effect, as plain data (id, kind, ends_at);
2. `decide` (pure, `decide_expiry`): the drills whose `ends_at` is at or before `now` are to be ended, and
   the run asks to be requeued when the next of the others ends (at most its interval, so a drill started
   through another controller replica, which wakes only that replica, is still seen in time);
3. `apply`: each is ended with a compare-and-set (an operator's stop that landed meanwhile wins), as
   drills.end_expired does: stopped_at = ends_at, stopped_by 'expired', audited with actor `controller`,
   a plant's node generation advanced; when a misroute ended, the routing generation is stamped so gateways
   can acknowledge the table without it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller import drills, routing_generation, views
from fleetctl.controller.drill_effects import MISROUTE
from fleetctl.controller.models import Drill
from fleetctl.controller.reconcile.protocol import Result

log = logging.getLogger(__name__)

DRILLS = "drills"


@dataclass(frozen=True)
class DrillItem:
    id: int
    kind: str
    ends_at: datetime


@dataclass(frozen=True)
class DrillSnapshot:
    drills: tuple[DrillItem, ...]


@dataclass(frozen=True)
class ExpiryDecision:
    expire: tuple[int, ...]  # drill ids whose time is up, oldest first
    requeue_after_s: float | None  # seconds until the next of the others ends; None: none left


@dataclass
class DrillReport:
    ended: list[int] = field(default_factory=list)  # drills this run ended
    routing_stamped: bool = False  # a misroute ended: the routing generation was stamped


def decide_expiry(snapshot: DrillSnapshot, now: datetime) -> ExpiryDecision:
    due = tuple(d.id for d in snapshot.drills if d.ends_at <= now)
    left = [(d.ends_at - now).total_seconds() for d in snapshot.drills if d.ends_at > now]
    return ExpiryDecision(due, min(left) if left else None)


class DrillReconciler:
    name = DRILLS

    def __init__(self, interval_s: float):
        self.interval_s = interval_s  # seconds between runs when no drill ends sooner

    def snapshot(self, session: Session, now: datetime) -> DrillSnapshot:
        rows = session.execute(select(Drill.id, Drill.kind, Drill.ends_at).where(Drill.stopped_at.is_(None))
                               .order_by(Drill.id)).tuples()
        return DrillSnapshot(tuple(DrillItem(id_, kind, ends_at) for id_, kind, ends_at in rows))

    def decide(self, snapshot: DrillSnapshot, now: datetime) -> ExpiryDecision:
        return decide_expiry(snapshot, now)

    def apply(self, session: Session, decision: ExpiryDecision, now: datetime) -> Result[DrillReport]:
        report = DrillReport()
        rows = [session.get(Drill, drill_id) for drill_id in decision.expire]
        ended = drills.end_expired(session, [row for row in rows if row is not None], now)
        report.ended = [d.id for d in ended]
        if any(d.kind == MISROUTE for d in ended):
            routing_generation.stamp(session, lambda: views.routing_content(session))
            report.routing_stamped = True
        if ended:
            log.info("drills: %s ended (their time was up)", ", ".join(str(i) for i in report.ended))
        requeue = decision.requeue_after_s
        return Result(report, changed=bool(ended),
                      requeue_after=None if requeue is None else min(requeue, self.interval_s))
