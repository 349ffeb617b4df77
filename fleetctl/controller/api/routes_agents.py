"""Agent <-> controller (docs/contracts.md): register, then heartbeat with observed state; the reply
carries the node's desired assignment and its generation. Agent tokens (or admin) only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from fleetctl.controller import nodes
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require
from fleetctl.controller.auth import AGENT
from fleetctl.controller.contract import HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse

router = APIRouter(prefix="/api/v1/agents", tags=["agents"])


@router.post("/register", name="agent.register", response_model=RegisterResponse)
def register(body: RegisterRequest, change: Change = Depends(mutation(AGENT))) -> dict[str, Any]:
    runtime = change.runtime
    with runtime.store.session() as session:
        node = nodes.register(session, body, runtime.clock())
        change.record(session, target=node.name)
        generation = node.generation
    runtime.wake()  # a new or changed node may change placement
    return {"node": body.node, "heartbeat_interval_s": runtime.settings.heartbeat_interval_s, "generation": generation}


@router.post("/heartbeat", name="agent.heartbeat", response_model=HeartbeatResponse,
             dependencies=[Depends(require(AGENT))])
def heartbeat(body: HeartbeatRequest, request: Request) -> dict[str, Any]:
    """Reads and writes only this node's rows; not audited (it reports, it does not change the fleet)."""
    runtime = get_runtime(request)  # called, not a dependency: a sync dependency costs a thread-pool hop per beat
    with runtime.store.session() as session:
        result = nodes.heartbeat(session, body, runtime.clock())
    if result.came_back:
        runtime.wake()
    return {"generation": result.generation, "assignment": result.assignment,
            "heartbeat_interval_s": runtime.settings.heartbeat_interval_s}
