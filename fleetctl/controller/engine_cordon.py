"""Engine cordon: hold one engine out of traffic while it keeps running.

A cordoned engine stays where it is, keeps its KV cache and its process, and still counts as one of its
deployment's replicas (nothing replaces it); the routing table marks it `cordoned` and the gateways send it
no new request (a canary probe that names it with x-fleet-pin-engine aside), and the controller counts it
as no ready engine of its revision (traffic guard, rollouts, the canary's pinned probes). It is what an
operator does to a suspect engine during an incident: stop its answers reaching users, keep it for a look.
`drain` is the other tool: it stops the engine and places a replacement.

Cordoning the last routable engine of a revision that has traffic would leave that traffic nowhere to go,
so it is refused (409 `no_ready_engines`): shift the traffic first (`fleetctl traffic set`) or drain it.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from fleetctl.controller.models import Assignment
from fleetctl.controller.traffic import model_weights, ready_engine_rows
from fleetctl.controller.traffic_guard import NO_READY_ENGINES
from fleetctl.errors import Conflict, NotFound


def set_engine_cordon(session: Session, name: str, cordoned: bool) -> bool:
    """Cordon or uncordon one engine (by its assignment); whether that changed anything. A drain is not undone."""
    assignment = session.get(Assignment, name)
    if assignment is None:
        raise NotFound(f"no assigned engine {name!r}", field="engine")
    if assignment.cordoned == cordoned:
        return False
    if cordoned:
        _refuse_if_last(session, assignment)
    assignment.cordoned = cordoned
    return True


def _refuse_if_last(session: Session, assignment: Assignment) -> None:
    weight = model_weights(session, assignment.model).get(assignment.class_ref, 0.0)
    if weight <= 0:
        return
    ready = {(node, name) for node, name, _ref, _role in ready_engine_rows(session, [assignment.class_ref])}
    this = (assignment.node, assignment.name)
    if this in ready and not ready - {this}:  # an engine that takes no traffic now may always be cordoned
        raise Conflict(f"engine {assignment.name} is the last routable engine of {assignment.class_ref}, which has "
                       f"traffic (weight {weight:g}): shift its traffic first (fleetctl traffic set) or drain it",
                       code=NO_READY_ENGINES, field="engine")
