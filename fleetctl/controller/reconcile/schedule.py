"""When each reconciler runs next: pure functions over a frozen per-reconciler record.

Times are seconds on a monotonic clock (the runner's `timer`), so a wall-clock step neither stalls nor
hurries the loops. Rules:

- a reconciler that has never run, or was woken, is due at once (`next_run_at` None);
- after a run that succeeded it is due `requeue_after` seconds later if the run asked for that (longer or
  shorter than its interval: a paused rollout may ask for ten minutes), else `interval_s` later;
- after a run that failed it is due after an exponential backoff: `interval_s`, then twice that, four
  times, ... capped at `max(interval_s, MAX_BACKOFF_S)`; the first success resets the count;
- a wake makes every reconciler due, a backed-off one included (a change just made is the best reason to
  try again), but keeps its failure count, so the next failure backs off further.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class Schedule:
    """One reconciler's place in time."""

    interval_s: float  # cadence when a run asks for no other
    next_run_at: float | None = None  # monotonic seconds; None: due now (never run, or woken)
    failures: int = 0  # runs failed in a row; 0 after any success


def is_due(schedule: Schedule, now: float) -> bool:
    return schedule.next_run_at is None or schedule.next_run_at <= now


def after_success(schedule: Schedule, now: float, requeue_after: float | None) -> Schedule:
    delay = schedule.interval_s if requeue_after is None else max(0.0, requeue_after)
    return replace(schedule, next_run_at=now + delay, failures=0)


def after_failure(schedule: Schedule, now: float) -> Schedule:
    failures = schedule.failures + 1
    return replace(schedule, next_run_at=now + backoff_s(failures, schedule.interval_s), failures=failures)


def backoff_s(failures: int, interval_s: float) -> float:
    """Seconds before retrying after the `failures`-th failure in a row (failures >= 1)."""
    cap = max(interval_s, MAX_BACKOFF_S)
    return min(interval_s * 2.0 ** min(failures - 1, 32), cap)  # the exponent is bounded: no float overflow


def woken(schedule: Schedule) -> Schedule:
    return replace(schedule, next_run_at=None)


def seconds_until_due(schedules: Iterable[Schedule], now: float) -> float | None:
    """How long until the first reconciler is due (0: one is due now); None when there are none."""
    waits = [0.0 if s.next_run_at is None else max(0.0, s.next_run_at - now) for s in schedules]
    return min(waits, default=None)
