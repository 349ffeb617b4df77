"""Nodes and engines: list, show, cordon, uncordon, drain (operator to change, viewer to read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from fleetctl.controller import adoption, engine_cordon, node_kv, nodes, routing_generation, views
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require, valid_name
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.responses import EngineChange, EngineView, KVFlushAccepted, NodeChange, NodeDetail, NodeView
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import Body, EngineAdopt, KVFlush

router = APIRouter(prefix="/api/v1", tags=["nodes"])
read = [Depends(require(VIEWER))]


@router.get("/nodes", name="node.list", response_model=list[NodeView], dependencies=read)
def node_list(runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    with runtime.store.session() as session:
        return views.nodes(session, runtime.clock())


@router.get("/nodes/{name}", name="node.show", response_model=NodeDetail, dependencies=read)
def node_show(name: str, runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return _node_detail(session, name, runtime)


def _node_detail(session: Session, name: str, runtime: ControllerRuntime) -> dict[str, Any]:
    engines = views.engines(session, runtime.clock(), node=name)
    return {**nodes.node_view(nodes.get_node(session, name), runtime.clock(), sum(e["deployment"] is not None for e in engines)),
            "engine_list": engines}


def _node_change(name: str, change: Change, apply: Callable[[Session, str], bool]) -> dict[str, Any]:
    runtime = change.runtime
    with runtime.store.session() as session:
        changed = apply(session, valid_name(name, "node"))
        change.record(session, target=name, result=OK if changed else NOOP)
        detail = _node_detail(session, name, runtime)
    runtime.wake()
    return {**detail, "result": "changed" if changed else "unchanged"}


@router.post("/nodes/{name}/cordon", name="node.cordon", response_model=NodeChange)
def node_cordon(name: str, body: Body | None = None, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """No new engines on this node; its engines keep running."""
    return _node_change(name, change, lambda s, n: nodes.set_cordon(s, n, True))


@router.post("/nodes/{name}/uncordon", name="node.uncordon", response_model=NodeChange)
def node_uncordon(name: str, body: Body | None = None, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """New engines may be placed here again (also ends a drain; drained engines are not brought back)."""
    return _node_change(name, change, lambda s, n: nodes.set_cordon(s, n, False))


@router.post("/nodes/{name}/drain", name="node.drain", response_model=NodeChange)
def node_drain(name: str, body: Body | None = None, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Cordon, and mark every engine on the node drain=true: the agent drains and stops them; the
    reconciler places replacements elsewhere."""
    return _node_change(name, change, nodes.drain_node)


@router.post("/nodes/{name}/kv/flush", name="node.kv_flush", response_model=KVFlushAccepted)
def node_kv_flush(name: str, body: KVFlush, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Drop the blocks of the node's KV tiers (a class's, or every class's; one tier, or both). The agent
    carries it out on its next heartbeat and reports it done (the node's `kv_flushed`); until then it is
    the node's `kv_flush`, and a second flush replaces it."""
    runtime = change.runtime
    with runtime.store.session() as session:
        node = nodes.get_node(session, valid_name(name, "node"))
        flush = node_kv.request_flush(node, body.class_name, body.tier, change.actor, change.reason, runtime.clock())
        change.record(session, target=name, detail={"class": body.class_name, "tier": body.tier, "id": flush["id"]})
    return {"node": name, "flush": flush}


@router.get("/engines", name="engine.list", response_model=list[EngineView], dependencies=read)
def engine_list(node: str | None = None, runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    with runtime.store.session() as session:
        return views.engines(session, runtime.clock(), node=node)


@router.get("/engines/{name}", name="engine.show", response_model=EngineView, dependencies=read)
def engine_show(name: str, runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return views.engine(session, name, runtime.clock())


@router.post("/engines/{name}/drain", name="engine.drain", response_model=EngineChange)
def engine_drain(name: str, body: Body | None = None, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Mark one engine drain=true; a replacement is placed if its deployment still wants it."""
    runtime = change.runtime
    with runtime.store.session() as session:
        _node, changed = nodes.drain_engine(session, name)
        change.record(session, target=name, result=OK if changed else NOOP)
        view = views.engine(session, name, runtime.clock())
    runtime.wake()
    return {**view, "result": "changed" if changed else "unchanged"}


@router.post("/engines/{name}/cordon", name="engine.cordon", response_model=EngineChange)
def engine_cordon_route(name: str, body: Body | None = None,
                        change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Hold one engine out of traffic: it keeps running and counting as a replica, and the gateways route it
    no new request. `generation` is the routing table generation that includes the change (gateways at or
    past it have applied it). 409 `no_ready_engines` when it is the last routable engine of a revision that
    has traffic."""
    return _engine_cordon(name, change, True)


@router.post("/engines/{name}/uncordon", name="engine.uncordon", response_model=EngineChange)
def engine_uncordon_route(name: str, body: Body | None = None,
                          change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Return a cordoned engine to traffic (a drain is not undone)."""
    return _engine_cordon(name, change, False)


def _engine_cordon(name: str, change: Change, cordoned: bool) -> dict[str, Any]:
    runtime = change.runtime
    with runtime.store.session() as session:
        changed = engine_cordon.set_engine_cordon(session, name, cordoned)
        change.record(session, target=name, result=OK if changed else NOOP)
        generation, _table = routing_generation.stamp(session, lambda: views.routing_content(session))
        view = views.engine(session, name, runtime.clock())
    return {**view, "result": "changed" if changed else "unchanged", "generation": generation}


@router.post("/engines/adopt", name="engine.adopt", response_model=EngineView)
def engine_adopt(body: EngineAdopt, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Bring in an engine fleetctl did not launch (an existing vLLM server): probed first, and refused with a
    422 naming the field when it cannot be reached, does not serve `model`, or reports a correctness-tagged
    setting that contradicts its class revision. Then gateways route to it; fleetctl never starts, stops or
    restarts it (docs/vllm.md)."""
    runtime = change.runtime
    name = body.name or adoption.default_name(body.url)
    with runtime.store.session() as session:
        spec = adoption.class_spec(session, body.class_ref)
        adoption.check_name_free(session, name)
    with httpx.Client() as http:  # no store session is held across the I/O
        probe = adoption.probe_engine(http, body.url, spec.backend)
    request = adoption.Adoption(name, body.url, body.model, body.class_ref, body.role, body.kv_events_endpoint)
    with runtime.store.session() as session:
        adoption.check_name_free(session, name)
        adoption.adopt(session, request, spec, probe, runtime.clock(), change.actor)
        change.record(session, target=name, result=OK)
        view = views.engine(session, name, runtime.clock())
    runtime.wake()
    return view


@router.post("/engines/{name}/release", name="engine.release", response_model=EngineChange)
def engine_release(name: str, body: Body | None = None, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Release an adopted engine: gateways stop sending it requests at once (`draining`); once they all
    have and nothing runs on it, it leaves the fleet. No signal is sent to it."""
    runtime = change.runtime
    with runtime.store.session() as session:
        changed = adoption.release(session, name, runtime.clock())
        change.record(session, target=name, result=OK if changed else NOOP)
        view = views.engine(session, name, runtime.clock())
    runtime.wake()
    return {**view, "result": "changed" if changed else "unchanged"}
