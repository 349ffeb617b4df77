"""The reconciler runtime: the controller leader runs a list of reconcilers, each on its own schedule.

- `protocol`: what a reconciler is (`Reconciler`: snapshot, pure decide, idempotent apply) and what a run
  returns (`Result`, with controller-runtime's `requeue_after`).
- `schedule`: when each reconciler runs next, as pure functions over a frozen `Schedule` record.
- `runner`: `ReconcileRunner` owns the leadership check, wakes, the schedules, error isolation and the
  per-reconciler metrics, and the background loop.

The placement reconciler (`fleetctl.controller.reconciler.PlacementReconciler`) is the first of them.
"""

from fleetctl.controller.reconcile.protocol import Reconciler, Result
from fleetctl.controller.reconcile.runner import PassReport, ReconcileRunner

__all__ = ["PassReport", "ReconcileRunner", "Reconciler", "Result"]
