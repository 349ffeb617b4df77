"""The placement reconciler: which engines every node runs. The first reconciler of the runtime
(fleetctl/controller/reconcile/); the decision itself is placement.py's pure functions.

One run (`PlacementReconciler`; `reconcile_once` is the same three steps in one call):
1. `snapshot`: deployments, known classes, every node with its assignment, observed engines and last
   heartbeat (`load_snapshot`; reads only);
2. `decide` (pure, `decide_placement`): nodes that missed heartbeats for `down_after_s` are to be marked
   down (their engines and assignments stay: the data plane outlives the control plane); `plan_assignments`
   computes every node's desired engines, seeing those nodes as down; the nodes whose plan differs from
   their stored assignment are to be written;
3. `apply`: the marks (the UPDATE re-checks the heartbeat time: a beat may have arrived since the
   snapshot), then each changed node's new rows and generation + 1. The write is a compare-and-set on the
   generation read in step 1, so a drain that landed meanwhile is not lost (that node is simply planned
   again on the next run).

Every write happens after the whole fleet is read, so the run holds no write lock (SQLite's only one, or
PostgreSQL's row locks on the marked nodes, which would stall their heartbeats) while it reads and plans.
Only the leader runs it (see leader.py and reconcile/runner.py). While the `reconciler` flag is off
or a break-glass freeze holds (fleetctl/flag_catalog.py, flags.reconciler_paused) a run decides nothing: the fleet stays as it is and keeps serving.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from fleetctl.controller import flags

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
from fleetctl.controller.reconcile.protocol import Result

log = logging.getLogger(__name__)

PLACEMENT = "placement"


@dataclass
class ReconcileResult:
    marked_down: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # nodes whose assignment (and generation) advanced
    skipped: list[str] = field(default_factory=list)  # lost a compare-and-set race; retried next run


@dataclass(frozen=True)
class Snapshot:
    deployments: list[DeploymentView]
    classes: set[str]
    nodes: list[NodeView]
    last_heartbeats: Mapping[str, datetime] = field(default_factory=dict)  # node name -> its last heartbeat
    paused: bool = False  # the `reconciler` flag is off or the fleet is frozen: placement changes nothing


@dataclass(frozen=True)
class AssignmentWrite:
    """One node's new assignment, written only if its generation is still the one the plan was made from."""

    node: str
    expected_generation: int
    assignments: tuple[EngineAssignment, ...]


@dataclass(frozen=True)
class PlacementDecision:
    mark_down: tuple[str, ...]  # up nodes silent for down_after_s at the snapshot, by name
    writes: tuple[AssignmentWrite, ...]  # nodes whose planned assignment differs from the stored one, by name


class PlacementReconciler:
    """Plans every node's engines (placement.py) and writes the nodes whose plan changed."""

    name = PLACEMENT

    def __init__(self, down_after_s: float, interval_s: float):
        self.down_after_s = down_after_s  # seconds without a heartbeat before a node is marked down
        self.interval_s = interval_s  # seconds between runs when nothing wakes the runner

    def snapshot(self, session: Session, now: datetime) -> Snapshot:
        return replace(load_snapshot(session), paused=flags.reconciler_paused(session, now))

    def decide(self, snapshot: Snapshot, now: datetime) -> PlacementDecision:
        return decide_placement(snapshot, now, self.down_after_s)

    def apply(self, session: Session, decision: PlacementDecision, now: datetime) -> Result[ReconcileResult]:
        result = apply_placement(session, decision, now, self.down_after_s)
        if result.changed or result.marked_down:
            log.info("reconcile: assignments changed on %d node(s), %d node(s) marked down",
                     len(result.changed), len(result.marked_down))
        return Result(result, changed=bool(result.changed or result.marked_down))


def reconcile_once(session: Session, now: datetime, down_after_s: float) -> ReconcileResult:
    """One placement run in `session`: snapshot, decide, apply."""
    decision = decide_placement(load_snapshot(session), now, down_after_s)
    return apply_placement(session, decision, now, down_after_s)


def decide_placement(snapshot: Snapshot, now: datetime, down_after_s: float) -> PlacementDecision:
    if snapshot.paused:  # the kill switch: no node marked down, no engine started, stopped or drained
        return PlacementDecision((), ())
    liveness = [(n.name, n.state, snapshot.last_heartbeats[n.name]) for n in snapshot.nodes]
    quiet = nodes_gone_quiet(liveness, now, down_after_s)
    nodes = [replace(n, state=DOWN) if n.name in quiet else n for n in snapshot.nodes]
    plan = plan_assignments(snapshot.deployments, snapshot.classes, nodes)
    current = {node.name: node.assignments for node in nodes}
    generations = {node.name: node.generation for node in nodes}
    writes = tuple(AssignmentWrite(name, generations[name], tuple(plan[name])) for name in changed_nodes(current, plan))
    return PlacementDecision(tuple(quiet), writes)


def apply_placement(session: Session, decision: PlacementDecision, now: datetime, down_after_s: float) -> ReconcileResult:
    result = ReconcileResult(marked_down=list(decision.mark_down))
    if decision.mark_down:
        mark_down(session, decision.mark_down, now, down_after_s)
    for write in decision.writes:
        if write_assignment(session, write.node, write.expected_generation, list(write.assignments)):
            result.changed.append(write.node)
        else:
            result.skipped.append(write.node)
    return result


def mark_down(session: Session, names: Sequence[str], now: datetime, down_after_s: float) -> None:
    """Mark `names` down, except those that heartbeat since they were found quiet."""
    cutoff = now - timedelta(seconds=down_after_s)
    session.execute(
        update(Node).where(Node.name.in_(names), Node.state == UP, Node.last_heartbeat_at < cutoff).values(state=DOWN)
    )


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
    rows = list(session.execute(select(Node)).scalars())
    nodes = [
        NodeView(
            name=n.name, labels=dict(n.labels), capacity_engines=n.capacity_engines, state=n.state,
            cordoned=n.cordoned, draining=n.draining, assignments=tuple(assignments[n.name]),
            observed=observed[n.name], generation=n.generation, applied_generation=n.applied_generation,
        )
        for n in rows
    ]
    return Snapshot(deployments, classes, nodes, {n.name: n.last_heartbeat_at for n in rows})


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
