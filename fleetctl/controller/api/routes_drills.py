"""Canary drills: start a misroute or a plant, list them, stop one or all (drills.py).

Reads need a viewer token, starts and stops an operator's. Every start and stop is audited (actions
`drill.start` and `drill.stop`) with the drill described in the reason, the caller's reason after it. A
start or stop answers with the routing-table generation that includes it (`generation`: a misroute has
reached every gateway that reports it). After each, the reconcilers are woken, so the drill reconciler
knows when the new drill ends.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from pydantic import Field
from sqlalchemy.orm import Session

from engine.contract.bounds import Finite, SafeStr
from fleetctl.controller import drills, routing_generation, views
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.models import Drill
from fleetctl.controller.responses import DrillStarted, DrillStopResult, DrillView
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import Body, ClassRef, Name, NonBlank

router = APIRouter(prefix="/api/v1/drills", tags=["drills"])
read = [Depends(require(VIEWER))]
DrillId = Annotated[int, Path(ge=1, le=2**31 - 1, description="the drill's id")]  # within the id column
DURATION = (f"seconds it lasts, more than 0 and at most {drills.MAX_DURATION_S:g} (4h); "
            f"default {drills.DEFAULT_DURATION_S:g} (20m)")


class DrillMisroute(Body):
    model: Annotated[NonBlank, Field(max_length=200)] = Field(description="the model whose traffic is misrouted")
    to: ClassRef = Field(description="the class revision NAME@rN that gets the fraction: deployed for the model, "
                                     "with a ready engine, not already carrying all of its traffic")
    fraction: Finite = Field(description=f"the share of the model's traffic sent there, in (0, {drills.MAX_FRACTION:g}]")
    duration_s: Finite | None = Field(default=None, description=DURATION)


class DrillPlant(Body):
    engine: Name = Field(description="the engine (running, not draining) restarted with the fault")
    fault: Annotated[SafeStr, Field(max_length=32)] = Field(description="one of engine.contract.faults.FAULTS")
    duration_s: Finite | None = Field(default=None, description=DURATION)


REFUSALS = {409: {"description": "refused: the model already has a drill in effect (`drill_in_progress`), the "
                                 "target is not deployed or has no ready engine, or already has all the traffic, "
                                 "or the engine is not running (`engine_not_running`)"}}
STARTS = {**REFUSALS, 404: {"description": "the model (no traffic policy and no deployment), the target class "
                                           "revision or the engine does not exist"}}


@router.post("/misroute", name="drill.start", response_model=DrillStarted, status_code=201, responses=STARTS)
def drill_misroute(body: DrillMisroute, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Send `fraction` of `model`'s traffic to `to` for `duration_s`. The stored traffic policy is not
    changed: the routing table carries the drill on top of it while it lasts."""
    runtime = change.runtime
    with runtime.store.session() as session:
        drill = drills.start_misroute(session, body.model, body.to, body.fraction, body.duration_s, change.actor,
                                      runtime.clock())
        view = _started(session, change, drill)
    runtime.wake()
    return view


@router.post("/plant", name="drill.start", response_model=DrillStarted, status_code=201, responses=STARTS)
def drill_plant(body: DrillPlant, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Restart `engine` with the hidden `fault` for `duration_s` (its agent restarts it on its next beat,
    and again, clean, when the drill ends)."""
    runtime = change.runtime
    with runtime.store.session() as session:
        drill = drills.start_plant(session, body.engine, body.fault, body.duration_s, change.actor, runtime.clock())
        view = _started(session, change, drill)
    runtime.wake()
    return view


def _started(session: Session, change: Change, drill: Drill) -> dict[str, Any]:
    now = change.runtime.clock()
    _with_reason(change, drills.describe(drill)).record(session, target=f"drills/{drill.id}", status=201)
    generation, _table = routing_generation.stamp(session, lambda: views.routing_content(session))
    return {**drills.drill_view(drill, now), "generation": generation}


@router.get("", name="drill.list", response_model=list[DrillView], dependencies=read)
def drill_list(runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """The drills in effect (oldest first), then the last 50 that ended (newest first)."""
    with runtime.store.session() as session:
        now = runtime.clock()
        return [drills.drill_view(row, now) for row in drills.list_drills(session)]


@router.post("/{drill_id}/stop", name="drill.stop", response_model=DrillStopResult, responses=REFUSALS)
def drill_stop(drill_id: DrillId, body: Body | None = None, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """End the drill now (`unchanged` when it had ended already)."""
    return _stop(change, drill_id, target=f"drills/{drill_id}")


@router.post("/stop", name="drill.stop", response_model=DrillStopResult, responses=REFUSALS)
def drill_stop_all(body: Body | None = None, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """End every drill in effect (`unchanged` when there was none)."""
    return _stop(change, None, target="drills")


def _stop(change: Change, drill_id: int | None, target: str) -> dict[str, Any]:
    runtime = change.runtime
    with runtime.store.session() as session:
        now = runtime.clock()
        stopped = drills.stop(session, drill_id, change.actor, now)
        what = "; ".join(drills.describe(d) for d in stopped) or "no drill in effect"
        _with_reason(change, f"stop {what}").record(session, target=target, result=OK if stopped else NOOP)
        generation, _table = routing_generation.stamp(session, lambda: views.routing_content(session))
        views_ = [drills.drill_view(d, now) for d in stopped]
    runtime.wake()
    return {"result": "changed" if stopped else "unchanged", "stopped": views_, "generation": generation}


def _with_reason(change: Change, description: str) -> Change:
    """The audit context with the drill described first, the caller's why after it."""
    reason = f"{description} ({change.reason})" if change.reason else description
    return dataclasses.replace(change, reason=reason)
