"""The reconciler: gather a snapshot, decide with pure functions (placement.py), write the differences.

One pass (`reconcile_once`):
1. nodes that missed heartbeats for `down_after` seconds are marked down (their engines and assignments
   stay: the data plane outlives the control plane);
2. `plan_assignments` computes every node's desired engines;
3. nodes whose plan differs from the stored assignment get the new rows and generation + 1. The write is
   a compare-and-set on the generation read in step 2, so a drain that landed meanwhile is not lost (that
   node is simply planned again on the next pass).

Only the leader runs passes (see leader.py and runtime.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from fleetctl.controller.models import Assignment, ClassRevision, Deployment, Engine, Node
from fleetctl.controller.nodes import DOWN, UP, to_assignment
from fleetctl.controller.placement import (
    DeploymentView,
    NodeView,
    Plan,
    PlannedEngine,
    changed_nodes,
    nodes_gone_quiet,
    plan_assignments,
)


@dataclass
class ReconcileResult:
    marked_down: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # nodes whose assignment (and generation) advanced
    skipped: list[str] = field(default_factory=list)  # lost a compare-and-set race; retried next pass


@dataclass(frozen=True)
class Snapshot:
    deployments: list[DeploymentView]
    classes: set[str]
    nodes: list[NodeView]


def reconcile_once(session: Session, now: datetime, down_after_s: float) -> ReconcileResult:
    result = ReconcileResult(marked_down=mark_down(session, now, down_after_s))
    if result.marked_down:
        # Commit the marks before reading the whole fleet: on SQLite the open write transaction holds the
        # database's only write lock, and on PostgreSQL the marked nodes' row locks, which would stall those
        # nodes' heartbeats (on SQLite every heartbeat) for the whole snapshot and plan.
        session.commit()
    snapshot = load_snapshot(session)
    plan = plan_assignments(snapshot.deployments, snapshot.classes, snapshot.nodes)
    current = {node.name: node.assignments for node in snapshot.nodes}
    generations = {node.name: node.generation for node in snapshot.nodes}
    for name in changed_nodes(current, plan):
        if write_assignment(session, name, generations[name], plan[name]):
            result.changed.append(name)
        else:
            result.skipped.append(name)
    return result


def mark_down(session: Session, now: datetime, down_after_s: float) -> list[str]:
    rows = session.execute(select(Node.name, Node.state, Node.last_heartbeat_at).where(Node.state == UP)).all()
    quiet = nodes_gone_quiet([tuple(row) for row in rows], now, down_after_s)
    if quiet:
        cutoff = now - timedelta(seconds=down_after_s)
        session.execute(  # re-check the time: a heartbeat may have arrived since the read
            update(Node).where(Node.name.in_(quiet), Node.last_heartbeat_at < cutoff).values(state=DOWN)
        )
    return quiet


def load_snapshot(session: Session) -> Snapshot:
    deployments = [
        DeploymentView(d.name, d.model, d.class_ref, d.role, d.replicas, dict(d.placement))
        for d in session.execute(select(Deployment)).scalars()
    ]
    classes = set(session.execute(select(ClassRevision.ref)).scalars())
    assignments: dict[str, list[PlannedEngine]] = defaultdict(list)
    for row in session.execute(select(Assignment)).scalars():
        assignments[row.node].append(to_assignment(row))
    observed: dict[str, dict[str, str]] = defaultdict(dict)
    for node, name, state in session.execute(select(Engine.node, Engine.name, Engine.state)).all():
        observed[node][name] = state
    nodes = [
        NodeView(
            name=n.name, labels=dict(n.labels), capacity_engines=n.capacity_engines, state=n.state,
            cordoned=n.cordoned, draining=n.draining, assignments=tuple(assignments[n.name]),
            observed=observed[n.name], generation=n.generation, applied_generation=n.applied_generation,
        )
        for n in session.execute(select(Node)).scalars()
    ]
    return Snapshot(deployments, classes, nodes)


def write_assignment(session: Session, node: str, expected_generation: int, assignments: list[PlannedEngine]) -> bool:
    """Replace a node's assignment if its generation is still `expected_generation`; advance it."""
    advanced = session.execute(
        update(Node).where(Node.name == node, Node.generation == expected_generation)
        .values(generation=expected_generation + 1)
    ).rowcount
    if not advanced:
        return False
    session.execute(delete(Assignment).where(Assignment.node == node))
    if assignments:
        session.execute(insert(Assignment), [
            {"name": a.name, "node": node, "deployment": a.deployment, "model": a.model, "class_ref": a.class_ref,
             "role": a.role, "drain": a.drain}
            for a in assignments
        ])
    return True


def current_plan(session: Session) -> Plan:
    """The stored assignments by node (for views and tests)."""
    plan: Plan = defaultdict(list)
    for row in session.execute(select(Assignment).order_by(Assignment.name)).scalars():
        plan[row.node].append(to_assignment(row))
    return dict(plan)
