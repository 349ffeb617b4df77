"""What one reconcile of a rollout observes of the fleet (rollout.state.Observations), read from the store.
Reads only: the rollout reconciler's snapshot, the start checks and the API's views all call `observe`.

- `weights`: the model's stored traffic policy; without one, every deployed revision equally (what the
  routing table says, views.routing_content);
- `acknowledged`: every awaited gateway (not stale, or cut off only while this controller was down:
  gateways.is_awaited) reports a routing generation at or past the one that contains the current routing
  content. When the content has changed since the counter was last stamped (routing_generation.py), no
  gateway can have applied it yet, so it is not acknowledged (the next gateway refresh stamps it). No
  awaited gateway at all: nothing to wait for;
- `ready`: ready, routable, undrained engines per revision (traffic.ready_engines_by_role), each role
  counted up to what its deployments ask for (`ready >= desired` only when every role is ready);
- `desired`: engines the model's deployments ask for, per revision (all roles);
- `served`: every gateway's latest per-revision counters (gateways.served_by_gateway);
- `drifted`: engines of A or B whose running config differs from their class (drift.drifted_engines);
- `quality`: the golden-set canary's word on each revision (canary_streams.quality, verdict.class_quality):
  'fail' when one of its pinned streams is drifting or failing, or the model's production stream alarmed
  blaming it; 'pass' when its batch-1 pinned stream is healthy and nothing fails it; None (not measured)
  otherwise, never a pass for lack of data;
- `frozen`: a break-glass freeze, or the rollout_automation flag off (flags.frozen); `pinned`: a break-glass
  pin of the model (its traffic goes to one revision whatever the weights say).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller import canary_streams, flags, views
from fleetctl.controller.drift import drifted_engines
from fleetctl.controller.gateways import is_awaited, served_by_gateway
from fleetctl.controller.models import Deployment, Gateway, RoutingState
from fleetctl.controller.rollout.state import Observations
from fleetctl.controller.routing_generation import ROW_ID, content_digest
from fleetctl.controller.traffic import model_weights, ready_engines_by_role


def observe(session: Session, model: str, refs: Iterable[str], now: datetime,
            acknowledged: bool | None = None) -> Observations:
    """The observations of `model`'s rollout between `refs` (A and B). `acknowledged` may be passed when
    the caller computed it once for several rollouts (`routing_acknowledged`)."""
    refs = sorted(set(refs))
    served = served_by_gateway(session, refs)
    drifted = {ref: engines for ref, engines in drifted_engines(session, model).items() if ref in refs}
    desired_by_role = desired_engines_by_role(session, model, refs)
    ready = ready_toward_desired(ready_engines_by_role(session, refs), desired_by_role)
    return Observations(
        weights=model_weights(session, model),
        acknowledged=routing_acknowledged(session, now) if acknowledged is None else acknowledged,
        ready={ref: ready.get(ref, 0) for ref in refs},
        desired={ref: sum(n for (r, _), n in desired_by_role.items() if r == ref) for ref in refs},
        drifted=drifted,
        served=served,
        quality=canary_streams.quality(session, model, refs),
        frozen=flags.frozen(session, now),
        pinned=flags.flag_value(session, "pin", now, model) is not None,
    )


def desired_engines_by_role(session: Session, model: str, refs: list[str]) -> dict[tuple[str, str], int]:
    """Engines the model's deployments ask for, per (class revision, role)."""
    desired: dict[tuple[str, str], int] = defaultdict(int)
    rows = session.execute(select(Deployment.class_ref, Deployment.role, Deployment.replicas)
                           .where(Deployment.model == model, Deployment.class_ref.in_(refs))).tuples()
    for ref, role, replicas in rows:
        desired[(ref, role)] += replicas
    return dict(desired)


def ready_toward_desired(ready: Mapping[tuple[str, str], int],
                         desired: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """Ready engines per revision, each role counted up to what it asks for, so that `ready >= desired`
    means every role is ready: two ready prefill engines do not make up for a missing decode engine."""
    counted: dict[str, int] = defaultdict(int)
    for (ref, role), wanted in desired.items():
        counted[ref] += min(ready.get((ref, role), 0), wanted)
    return dict(counted)


def routing_acknowledged(session: Session, now: datetime, heard_since: datetime | None = None) -> bool:
    """`heard_since`: when the caller started listening to gateways (a reconciler's first run); a gateway
    last heard before it is waited for a while longer (gateways.is_awaited)."""
    live = [g.generation for g in session.execute(select(Gateway)).scalars()
            if is_awaited(g.last_seen_at, g.refresh_interval_s, now, heard_since)]
    if not live:
        return True
    stamped = session.execute(
        select(RoutingState.generation, RoutingState.digest).where(RoutingState.id == ROW_ID)).first()
    if stamped is None or stamped[1] != content_digest(views.routing_content(session)):
        return False
    return all(generation >= stamped[0] for generation in live)
