"""Direct actions (controller/direct_actions.py): nodes upload their break-glass journals; operators see the
divergences and adopt or revert them.

    POST /api/v1/breakglass/direct-actions   a node's upload: an agent token for an agent's journal, the
                                             gateway's own (viewer) token for a gateway's; not audited itself,
                                             each new action is (actor `direct:NODE`)
    GET  /api/v1/breakglass/divergence       open direct actions desired state does not agree with (?all=true:
                                             every uploaded action)
    POST /api/v1/breakglass/reconcile        admin, with a reason: adopt or revert divergences by id
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from engine.contract.direct import DirectUpload, DirectUploadReply
from fleetctl.controller import direct_actions, routing_generation, views
from fleetctl.controller.api import flag_writes
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require
from fleetctl.controller.auth import ADMIN, AGENT, VIEWER, Principal, authorize
from fleetctl.controller.responses import DirectDivergence, ReconcileResult
from fleetctl.controller.schemas import Reconcile
from fleetctl.errors import ValidationFailed

router = APIRouter(prefix="/api/v1/breakglass", tags=["break-glass"])


@router.post("/direct-actions", name="breakglass.upload", response_model=DirectUploadReply)
def upload(body: DirectUpload, request: Request, principal: Principal = Depends(require(None))) -> dict[str, Any]:
    """Store a node's new journal entries (each once, by sequence number) and say how the operator resolved
    the holds it still has open."""
    authorize(principal, AGENT if body.kind == "agent" else VIEWER)
    runtime = get_runtime(request)
    with runtime.store.session() as session:
        return direct_actions.ingest(session, body, runtime.clock())


@router.get("/divergence", name="breakglass.divergence", response_model=list[DirectDivergence],
            dependencies=[Depends(require(VIEWER))])
def divergence(request: Request, all: bool = Query(default=False, description="every uploaded direct action")) -> list[dict[str, Any]]:
    runtime = get_runtime(request)
    with runtime.store.session() as session:
        return direct_actions.divergences(session, runtime.clock(), include_resolved=all)


@router.post("/reconcile", name="breakglass.reconcile", response_model=ReconcileResult,
             responses={404: {"description": "no direct action with that id (`ids`)"}})
def reconcile(body: Reconcile, change: Change = Depends(mutation(ADMIN))) -> dict[str, Any]:
    """Adopt (desired state takes the action over) or revert (the node undoes it) each named divergence."""
    flag_writes.require_reason(change, "reconciling direct actions")
    if not body.adopt and not body.revert:
        raise ValidationFailed("adopt: name at least one direct action to adopt or revert", field="adopt")
    if set(body.adopt) & set(body.revert):
        raise ValidationFailed("revert: an action cannot be both adopted and reverted", field="revert")
    runtime = change.runtime
    with runtime.store.session() as session:
        now = runtime.clock()
        done = [*direct_actions.resolve(session, body.adopt, "adopt", change.actor, change.reason, now),
                *direct_actions.resolve(session, body.revert, "revert", change.actor, change.reason, now)]
        change.record(session, target="direct-actions",
                      detail={"adopted": body.adopt, "reverted": body.revert,
                              "flags": [r.flag_key for r in done if r.flag_key]})
        generation, _table = routing_generation.stamp(session, lambda: views.routing_content(session))
    runtime.wake()
    return {"adopted": body.adopt, "reverted": body.revert, "generation": generation}
