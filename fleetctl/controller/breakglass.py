"""Break-glass: the admin's levers for an incident, each one an override of an admin-only catalog flag
(fleetctl/flag_catalog.py), so it carries an owner, a reason and an optional TTL, reaches gateways in the
routing table, and shows in `fleetctl status`, the watch stream and the audit like any flag.

- freeze / unfreeze: the `freeze` flag. Placement changes nothing and every rollout holds (`paused_by:
  freeze`); serving goes on.
- pin / unpin MODEL REF: the `pin:MODEL` flag. Gateways send all of the model's traffic to REF, over its
  weights, drills and rollouts (which hold, `paused_by: pin`). Refused unless REF serves the model now.
- shed MODEL F: the `shed_fraction:MODEL` flag (gateways answer that fraction 429 with Retry-After).
- kill-switch FLAG: a boolean flag that is on by default, turned off (`flag unset` turns it back on).

The checks here are the ones a plain flag write does not make (the model exists, REF serves it with a
ready engine); the API applies the change through the same path as `flag set`.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.models import Deployment, TrafficPolicy
from fleetctl.controller.traffic import ready_engines
from fleetctl.errors import Conflict, ValidationFailed
from fleetctl.flag_catalog import KILL_SWITCHES, FlagError, key_of, parse_key


def known_model(session: Session, model: str) -> None:
    """ValidationFailed naming `model` when no deployment or traffic policy has it."""
    deployed = session.execute(select(Deployment.name).where(Deployment.model == model).limit(1)).first()
    if deployed is None and session.get(TrafficPolicy, model) is None:
        raise ValidationFailed(f"model: no deployment or traffic policy serves model {model!r}", field="model")


def check_pin(session: Session, model: str, class_ref: str) -> None:
    """A pin must name a revision the model is deployed on, with a ready engine now (pinning to nothing
    would refuse every request): 422 naming `class_ref`, or 409 `no_ready_engines`."""
    known_model(session, model)
    deployed = session.execute(select(Deployment.name).where(
        Deployment.model == model, Deployment.class_ref == class_ref, Deployment.replicas > 0).limit(1)).first()
    if deployed is None:
        raise ValidationFailed(f"class_ref: {class_ref} is not deployed for model {model!r}", field="class_ref")
    if not ready_engines(session, [class_ref]).get(class_ref):
        raise Conflict(f"{class_ref} has no ready engine: pinning {model} to it would refuse every request",
                       code="no_ready_engines")


def kill_switch_key(flag: str, model: str | None) -> str:
    """The key a kill switch turns off; ValidationFailed naming `flag` (not a kill switch) or `model`."""
    if flag not in KILL_SWITCHES:
        raise ValidationFailed(f"flag: {flag!r} is not a kill switch; these are: {', '.join(KILL_SWITCHES)}",
                               field="flag")
    key = key_of(flag, model)
    try:  # a per-model flag without a model, or a fleet-wide one with one
        parse_key(key)
    except FlagError as exc:
        raise ValidationFailed(str(exc).replace("name:", "model:", 1), field="model") from None
    return key
