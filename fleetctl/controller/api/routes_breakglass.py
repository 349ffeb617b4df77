"""Break-glass levers (controller/breakglass.py): admin only, a reason always, each audited under its own
action (`breakglass.freeze`, ...) and refused (and the refusal audited) without the role or the reason.
Every lever is an override of a catalog flag, so its result is a flag write's (`generation`: gateways at
or past it apply it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from fleetctl.controller import breakglass
from fleetctl.controller.api import flag_writes
from fleetctl.controller.api.deps import Change, mutation, valid_name
from fleetctl.controller.auth import ADMIN
from fleetctl.controller.responses import FlagSetResult
from fleetctl.controller.schemas import BreakGlass, BreakGlassKill, BreakGlassPin, BreakGlassShed
from fleetctl.flag_catalog import key_of

router = APIRouter(prefix="/api/v1/breakglass", tags=["break-glass"])
admin = mutation(ADMIN)


@router.post("/freeze", name="breakglass.freeze", response_model=FlagSetResult)
def freeze(body: BreakGlass, change: Change = Depends(admin)) -> dict[str, Any]:
    """Placement changes nothing and every rollout holds (`paused_by: freeze`) until unfreeze (or `ttl_s`)."""
    flag_writes.require_reason(change, "a freeze")
    return flag_writes.write_override(change, "freeze", True, body.ttl_s)


@router.post("/unfreeze", name="breakglass.unfreeze", response_model=FlagSetResult)
def unfreeze(body: BreakGlass, change: Change = Depends(admin)) -> dict[str, Any]:
    flag_writes.require_reason(change, "an unfreeze")
    return flag_writes.remove_override(change, "freeze")


@router.post("/pin/{model}", name="breakglass.pin", response_model=FlagSetResult,
             responses={409: {"description": "the revision has no ready engine"}})
def pin(model: str, body: BreakGlassPin, change: Change = Depends(admin)) -> dict[str, Any]:
    """All of `model`'s traffic to `class_ref` (deployed for the model, with a ready engine), over its
    weights, drills and rollouts, until unpinned (or `ttl_s`)."""
    valid_name(model, "model")
    flag_writes.require_reason(change, "a pin")
    return flag_writes.write_override(change, key_of("pin", model), body.class_ref, body.ttl_s,
                                      check=lambda session: breakglass.check_pin(session, model, body.class_ref))


@router.delete("/pin/{model}", name="breakglass.unpin", response_model=FlagSetResult)
def unpin(model: str, body: BreakGlass | None = None, change: Change = Depends(admin)) -> dict[str, Any]:
    valid_name(model, "model")
    flag_writes.require_reason(change, "an unpin")
    return flag_writes.remove_override(change, key_of("pin", model))


@router.post("/shed/{model}", name="breakglass.shed", response_model=FlagSetResult)
def shed(model: str, body: BreakGlassShed, change: Change = Depends(admin)) -> dict[str, Any]:
    """Gateways answer `fraction` of the model's requests 429 with Retry-After at once (0: stop)."""
    valid_name(model, "model")
    flag_writes.require_reason(change, "shedding")
    key = key_of("shed_fraction", model)
    if body.fraction == 0:
        return flag_writes.remove_override(change, key)
    return flag_writes.write_override(change, key, body.fraction, body.ttl_s,
                                      check=lambda session: breakglass.known_model(session, model))


@router.post("/kill-switch/{flag}", name="breakglass.kill_switch", response_model=FlagSetResult)
def kill_switch(flag: str, body: BreakGlassKill, change: Change = Depends(admin)) -> dict[str, Any]:
    """Turn a default-on flag off (prefix_routing, pd_disaggregation with `model`, ...); `flag unset` or
    this flag's TTL turns it back on."""
    key = breakglass.kill_switch_key(flag, body.model)
    flag_writes.require_reason(change, "a kill switch")
    return flag_writes.write_override(change, key, False, body.ttl_s)
