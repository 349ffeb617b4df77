"""Nodes and their agents: registration, heartbeats, cordon, uncordon, drain (of a node or one engine).

The heartbeat is O(1) in fleet size: it reads and writes only the node's own rows (the node, its observed
engines, its assignments and their class specs). It never reconciles; the reconciler's loop does that.
It is the one high-rate call (every node, every interval), so it is written as a few Core statements
rather than ORM objects: one UPDATE ... RETURNING for the node, replace its engines, read its assignment.
Drains set `drain` on assignments directly and advance the node's generation, so the agent sees a drain on
its next heartbeat even when no reconcile leader is running.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from fleetctl.controller import drill_effects, node_kv
from fleetctl.controller.contract import HeartbeatRequest, RegisterRequest
from fleetctl.controller.models import Assignment, ClassRevision, Engine, Node
from fleetctl.controller.placement import PlannedEngine
from fleetctl.errors import NotFound

UP, DOWN = "up", "down"


def register(session: Session, req: RegisterRequest, now: datetime) -> Node:
    node = session.get(Node, req.node)
    if node is None:
        node = Node(name=req.node, registered_at=now, cordoned=False, draining=False, generation=0, applied_generation=0)
        session.add(node)
    node.url, node.labels, node.agent_version = req.url, dict(req.labels), req.agent_version
    node.capacity_engines, node.capacity_kv_mib = req.capacity.engines, req.capacity.kv_mib
    node.state, node.last_heartbeat_at = UP, now
    session.flush()
    return node


@dataclass(frozen=True)
class HeartbeatResult:
    generation: int
    assignment: list[dict[str, Any]]
    came_back: bool  # the node was down: placement may change, so reconcile soon
    kv_flush: dict[str, Any] | None = None  # a flush of its KV tiers asked for and not yet done (node_kv.py)


# Core tables and the assignment query, shared with heartbeats.py (its batched write-behind path).
NODES_TABLE, ENGINES_TABLE = Node.__table__, Engine.__table__


def heartbeat(session: Session, req: HeartbeatRequest, now: datetime) -> HeartbeatResult:
    # The node's row is updated first: its generation is read under the row's write lock (the reconciler and
    # drains advance it with an UPDATE of the same row before they commit new assignment rows), so the
    # assignment read below in this transaction is the one that generation names.
    values = {"state": UP, "last_heartbeat_at": now, "applied_generation": req.generation, "cut_off_s": req.cut_off_s,
              "kv_tiers": node_kv.tier_rows(req)}
    row = _update_node(session, req.node, values, only_if_up=True)
    came_back = row is None  # down (or unknown): placement may change, so the caller wakes the reconciler
    if came_back:
        row = _update_node(session, req.node, values, only_if_up=False)
        if row is None:
            raise NotFound(f"node {req.node!r} is not registered; register first", code="node_not_registered", field="node")
    _replace_observed(session, req, now)
    generation, kv_flush = row
    if req.kv_flushed is not None and node_kv.acknowledge_flush(session, req.node, req.kv_flushed, now):
        generation, kv_flush = generation + 1, None
    return HeartbeatResult(generation, assignment_of(session, req.node), came_back, kv_flush)


def _update_node(session: Session, node: str, values: dict[str, Any], only_if_up: bool) -> Any:
    """(generation, kv_flush) of the updated node, or None when no row matched."""
    where = [NODES_TABLE.c.name == node] + ([NODES_TABLE.c.state == UP] if only_if_up else [])
    statement = update(NODES_TABLE).where(*where).values(values).returning(NODES_TABLE.c.generation,
                                                                           NODES_TABLE.c.kv_flush)
    return session.execute(statement).one_or_none()


def _replace_observed(session: Session, req: HeartbeatRequest, now: datetime) -> None:
    session.execute(delete(ENGINES_TABLE).where(ENGINES_TABLE.c.node == req.node))
    if req.engines:
        session.execute(insert(ENGINES_TABLE), observed_rows(req, now))


def observed_rows(req: HeartbeatRequest, now: datetime) -> list[dict[str, Any]]:
    """The engines table's rows for a beat's observed engines."""
    return [{**engine.model_dump(exclude={"metrics"}), "metrics": engine.metrics.model_dump(), "node": req.node,
             "updated_at": now}
            for engine in req.engines]


ASSIGNMENT_ROWS = (
    select(Assignment.name, Assignment.deployment, Assignment.model, Assignment.class_ref, Assignment.role,
           Assignment.drain, ClassRevision.spec)
    .join(ClassRevision, ClassRevision.ref == Assignment.class_ref)
)


def assignment_of(session: Session, node: str) -> list[dict[str, Any]]:
    """The node's desired engines in the contract's EngineAssignment form (spec included, and the fault
    of a plant drill in effect: drill_effects.py)."""
    rows = session.execute(ASSIGNMENT_ROWS.where(Assignment.node == node).order_by(Assignment.name)).all()
    faults = drill_effects.planted_faults(session, [row.name for row in rows]) if rows else {}
    return [to_assignment(row).to_contract(row.spec, faults.get(row.name)) for row in rows]


def to_assignment(row: Assignment) -> PlannedEngine:
    return PlannedEngine(row.name, row.deployment, row.model, row.class_ref, row.role, row.drain)


def get_node(session: Session, name: str) -> Node:
    node = session.get(Node, name)
    if node is None:
        raise NotFound(f"no node {name!r}", field="node")
    return node


def set_cordon(session: Session, name: str, cordoned: bool) -> bool:
    """Cordon (no new engines) or uncordon (also ends a drain). True if anything changed."""
    node = get_node(session, name)
    changed = node.cordoned != cordoned or (not cordoned and node.draining)
    node.cordoned = cordoned
    if not cordoned:
        node.draining = False
    return changed


def drain_node(session: Session, name: str) -> bool:
    """Cordon the node and drain all its engines. True if anything changed."""
    node = get_node(session, name)
    changed = not (node.cordoned and node.draining)
    node.cordoned = node.draining = True
    marked = session.execute(
        update(Assignment).where(Assignment.node == name, Assignment.drain.is_(False)).values(drain=True)
    ).rowcount
    if marked:
        node.generation += 1
    return changed or bool(marked)


def drain_engine(session: Session, name: str) -> tuple[str, bool]:
    """Drain one engine (by its assignment). Returns (node, changed)."""
    assignment = session.get(Assignment, name)
    if assignment is None:
        raise NotFound(f"no assigned engine {name!r}", field="engine")
    if assignment.drain:
        return assignment.node, False
    assignment.drain = True
    get_node(session, assignment.node).generation += 1
    return assignment.node, True


def node_view(node: Node, now: datetime, engines: int) -> dict[str, Any]:
    return {
        "name": node.name, "url": node.url, "state": node.state, "cordoned": node.cordoned,
        "draining": node.draining, "labels": node.labels,
        "capacity": {"engines": node.capacity_engines, "kv_mib": node.capacity_kv_mib},
        "agent_version": node.agent_version, "engines": engines,
        "last_heartbeat_at": node.last_heartbeat_at.isoformat(),
        "heartbeat_age_s": round((now - node.last_heartbeat_at).total_seconds(), 1),
        "generation": node.generation, "applied_generation": node.applied_generation, "cut_off_s": node.cut_off_s,
        "registered_at": node.registered_at.isoformat(), "kv_tiers": node.kv_tiers or [], "kv_flush": node.kv_flush,
        "kv_flushed": node.kv_flushed,
    }
