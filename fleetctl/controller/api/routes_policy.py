"""Traffic policies (model -> {class_ref: weight}) and feature flags; both reach gateways via routing."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from fleetctl.controller import flags, traffic
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require, valid_name
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import FlagSet, TrafficSet

router = APIRouter(prefix="/api/v1", tags=["policy"])
read = [Depends(require(VIEWER))]


@router.get("/traffic", name="traffic.list", dependencies=read)
def traffic_list(runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return traffic.list_traffic(session)


@router.put("/traffic/{model}", name="traffic.set")
def traffic_set(model: str, body: TrafficSet, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    runtime = change.runtime
    with runtime.store.session() as session:
        changed = traffic.set_traffic(session, model, dict(body.weights), change.actor, runtime.clock())
        change.record(session, target=model, result=OK if changed else NOOP)
    return {"model": model, "weights": body.weights, "result": "changed" if changed else "unchanged"}


@router.get("/flags", name="flag.list", dependencies=read)
def flag_list(runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return flags.list_flags(session)


@router.put("/flags/{name}", name="flag.set")
def flag_set(name: str, body: FlagSet, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    runtime = change.runtime
    with runtime.store.session() as session:
        changed = flags.set_flag(session, valid_name(name), body.value, change.actor, runtime.clock())
        change.record(session, target=name, result=OK if changed else NOOP)
    return {"name": name, "value": body.value, "result": "changed" if changed else "unchanged"}
