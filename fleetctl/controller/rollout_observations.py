"""What one reconcile of a rollout observes of the fleet (rollout.state.Observations), read from the store.
Reads only: the rollout reconciler's snapshot, the start checks and the API's views all call `observe`.

- `weights`: the model's stored traffic policy; without one, every deployed revision equally (what the
  routing table says, views.routing_content);
- `acknowledged`: every live (non-stale) gateway reports a routing generation at or past the one that
  contains the current routing content. When the content has changed since the counter was last stamped
  (routing_generation.py), no gateway can have applied it yet, so it is not acknowledged (the next
  gateway refresh stamps it). No live gateway at all: nothing to wait for;
- `ready`: ready, routable, undrained engines per revision (traffic.ready_engines);
- `desired`: engines the model's deployments ask for, per revision (all roles);
- `drifted`, `served`: read through `served_and_drifted`, the one seam for the gateway counters and the
  live drift detection;
- `quality`: None (not measured) for every revision until the golden-set canary exists.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller import views
from fleetctl.controller.gateways import is_stale, served_by_gateway
from fleetctl.controller.models import Deployment, Gateway, RoutingState, TrafficPolicy
from fleetctl.controller.rollout.state import Observations, ServedByGateway
from fleetctl.controller.routing_generation import ROW_ID, content_digest
from fleetctl.controller.traffic import ready_engines


def observe(session: Session, model: str, refs: Iterable[str], now: datetime,
            acknowledged: bool | None = None) -> Observations:
    """The observations of `model`'s rollout between `refs` (A and B). `acknowledged` may be passed when
    the caller computed it once for several rollouts (`routing_acknowledged`)."""
    refs = sorted(set(refs))
    served, drifted = served_and_drifted(session, model, refs)
    ready = ready_engines(session, refs)
    return Observations(
        weights=model_weights(session, model),
        acknowledged=routing_acknowledged(session, now) if acknowledged is None else acknowledged,
        ready={ref: ready.get(ref, 0) for ref in refs},
        desired=desired_engines(session, model, refs),
        drifted=drifted,
        served=served,
        quality={ref: None for ref in refs},
        frozen=False,  # break-glass freeze is not built yet; the machine already pauses on it
    )


def served_and_drifted(session: Session, model: str, refs: list[str]) -> tuple[ServedByGateway, Mapping[str, tuple[str, ...]]]:
    """The gateway counters and the live drift detection, in one seam:
    - served: `served_by_gateway(session, refs)` (gateway -> class_ref -> ServedCounters);
    - drifted: SEAM, wired when live drift detection is merged: `drifted_engines(session, model)`
      (class_ref -> engines whose running config differs); until then nothing has drifted."""
    served: ServedByGateway = served_by_gateway(session, refs)
    drifted: Mapping[str, tuple[str, ...]] = {}
    return served, drifted


def model_weights(session: Session, model: str) -> dict[str, float]:
    row = session.get(TrafficPolicy, model)
    if row is not None:
        return {ref: float(weight) for ref, weight in row.weights.items()}
    deployed = session.execute(
        select(Deployment.class_ref).where(Deployment.model == model, Deployment.replicas > 0)).scalars()
    return {ref: 1.0 for ref in sorted(set(deployed))}


def desired_engines(session: Session, model: str, refs: list[str]) -> dict[str, int]:
    desired: dict[str, int] = defaultdict(int)
    rows = session.execute(select(Deployment.class_ref, Deployment.replicas)
                           .where(Deployment.model == model, Deployment.class_ref.in_(refs))).tuples()
    for ref, replicas in rows:
        desired[ref] += replicas
    return {ref: desired.get(ref, 0) for ref in refs}


def routing_acknowledged(session: Session, now: datetime) -> bool:
    live = [g.generation for g in session.execute(select(Gateway)).scalars()
            if not is_stale(max((now - g.last_seen_at).total_seconds(), 0.0), g.refresh_interval_s)]
    if not live:
        return True
    stamped = session.execute(
        select(RoutingState.generation, RoutingState.digest).where(RoutingState.id == ROW_ID)).first()
    if stamped is None or stamped[1] != content_digest(views.routing_content(session)):
        return False
    return all(generation >= stamped[0] for generation in live)
