"""Fleet-wide reads: status (one call for `fleetctl status`), live config drift, the gateway's routing table,
health."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from fleetctl.controller import drift, views
from fleetctl.controller.api.deps import get_runtime, require
from fleetctl.controller.auth import VIEWER
from fleetctl.controller.contract import RoutingTable
from fleetctl.controller.db import current_revision
from fleetctl.controller.responses import EngineDrift, FleetStatus, Health
from fleetctl.controller.runtime import ControllerRuntime

router = APIRouter(tags=["fleet"])
read = [Depends(require(VIEWER))]


@router.get("/healthz", name="health", response_model=Health)
def health(runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    """No auth. `schema` is the applied migration."""
    return {"ok": True, "leader": runtime.is_leader, "schema": current_revision(runtime.store.engine)}


@router.get("/api/v1/status", name="status", response_model=FleetStatus, dependencies=read)
def status(runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return views.status(session, runtime.clock(), runtime.is_leader)


@router.get("/api/v1/routing", name="routing", response_model=RoutingTable, dependencies=read)
def routing(runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return views.routing(session)


@router.get("/api/v1/drift", name="drift", response_model=list[EngineDrift], dependencies=read)
def live_drift(model: str | None = None, runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """Each running engine (of `model`, if given) against its class revision: what its command line and the
    engine itself say it runs, and every difference (fleetctl/controller/drift.py)."""
    with runtime.store.session() as session:
        return [engine.as_dict() for engine in drift.engine_drift(session, model)]
