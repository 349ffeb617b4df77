"""Agent <-> controller (docs/contracts.md): register, then heartbeat with observed state; the reply
carries the node's desired assignment and its generation. Agent tokens (or admin) only."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from fleetctl.controller import node_kv, nodes
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require
from fleetctl.controller.auth import AGENT
from fleetctl.controller.contract import HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse
from fleetctl.controller.heartbeats import CachedNode, reply_body
from fleetctl.controller.runtime import ControllerRuntime

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
             dependencies=[Depends(require(AGENT))],
             responses={404: {"description": "the node is not registered (`node_not_registered`): register again"}})
async def heartbeat(body: HeartbeatRequest, request: Request) -> Response:
    """Reads and writes only this node's rows; not audited (it reports, it does not change the fleet).
    Answered from memory and stored in the next batch when the node is known to be up (heartbeats.py)."""
    runtime = get_runtime(request)
    now = runtime.clock()
    buffer = runtime.heartbeats
    cached = buffer.accept(body, now) if buffer is not None else None
    if cached is None:
        cached = await run_in_threadpool(beat_now, runtime, body, now)
    return Response(reply_body(cached, runtime.settings.heartbeat_interval_s), media_type="application/json")


def beat_now(runtime: ControllerRuntime, body: HeartbeatRequest, now: datetime) -> CachedNode:
    """The synchronous path: this beat in its own transaction (the node was down, unknown, or write-behind is off)."""
    with runtime.store.session() as session:
        result = nodes.heartbeat(session, body, now)
        disk = node_kv.disk_enabled(session, now)
    if result.came_back:
        runtime.wake()
    if runtime.heartbeats is not None:
        return runtime.heartbeats.remember(body, result, now)
    return CachedNode.of(result, disk)
