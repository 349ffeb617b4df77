"""What a reconciler is, and what one run of it returns.

A reconciler is level-based (controller-runtime, kopf): every run re-reads the state it needs, decides from
that alone, and acts idempotently, so running it twice, late, or after a crash halfway is harmless. A run
is three steps, each with one job:

1. `snapshot(session, now)` reads plain data from the store (no writes);
2. `decide(snapshot, now)` is a pure function of the snapshot and the time: tests call it directly;
3. `apply(session, decision, now)` writes the decision (compare-and-set where another writer may race) and
   returns a `Result`: what was done, whether the store changed, and when to run again.

The runner (runner.py) gives each run its own session (one unit of work: committed on success, rolled back
on an error), so one reconciler's failure never undoes another's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from sqlalchemy.orm import Session

SnapshotT = TypeVar("SnapshotT")
DecisionT = TypeVar("DecisionT")
ReportT = TypeVar("ReportT")
ReportT_co = TypeVar("ReportT_co", covariant=True)


@dataclass(frozen=True)
class Result(Generic[ReportT]):
    """One run's outcome (controller-runtime's `reconcile.Result`)."""

    report: ReportT  # the reconciler's own record of what it did (placement: nodes changed, marked down)
    changed: bool = False  # the run wrote to the store: agents' cached replies should pick it up now
    requeue_after: float | None = None  # seconds until the next run; None: after the reconciler's interval_s
    # (a wake runs every reconciler at once either way)
    wake: bool = False  # this run changed what other reconcilers read (a rollout scaled deployments): run them
    # all again at once rather than at their next interval


class Reconciler(Protocol[SnapshotT, DecisionT, ReportT_co]):
    """One reconcile loop. `name` labels its metrics and log lines (unique in a runner); `interval_s` is
    its cadence when `apply` asks for no other."""

    @property
    def name(self) -> str: ...

    @property
    def interval_s(self) -> float: ...

    def snapshot(self, session: Session, now: datetime) -> SnapshotT:
        """Read what `decide` needs, as plain data."""
        ...

    def decide(self, snapshot: SnapshotT, now: datetime) -> DecisionT:
        """Pure: the same snapshot and time give the same decision."""
        ...

    def apply(self, session: Session, decision: DecisionT, now: datetime) -> Result[ReportT_co]:
        """Write the decision; idempotent. Raising rolls the run back and counts as an error."""
        ...
