"""Gateways acknowledge the routing table they applied (report), and anyone may see which (list).

Reporting needs only a viewer token, the one a gateway already holds to read `/api/v1/routing`: a report
changes nothing in the fleet (like an agent heartbeat it is not audited), and the reporting token's name
is kept with it (`reported_by`), so a report from an unexpected token is visible.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from fleetctl.controller import gateways
from fleetctl.controller.api.deps import get_runtime, require
from fleetctl.controller.auth import VIEWER, Principal
from fleetctl.controller.contract import GatewayReport, GatewayView
from fleetctl.controller.runtime import ControllerRuntime

router = APIRouter(prefix="/api/v1/gateways", tags=["gateways"])


@router.post("/report", name="gateway.report", response_model=GatewayView)
def report(body: GatewayReport, principal: Principal = Depends(require(VIEWER)),
           runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    now = runtime.clock()
    with runtime.store.session() as session:
        row = gateways.report(session, body, principal.name, now)
        session.flush()
        return gateways.gateway_view(row, now)


@router.get("", name="gateway.list", response_model=list[GatewayView], dependencies=[Depends(require(VIEWER))])
def gateway_list(runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """Every gateway that ever reported, with `stale` when not heard from for 3 of its refresh intervals."""
    with runtime.store.session() as session:
        return gateways.list_gateways(session, runtime.clock())
