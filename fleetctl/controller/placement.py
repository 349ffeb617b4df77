"""Placement: which engines each node should run. A pure function over a snapshot of the fleet.

`plan_assignments(deployments, classes, nodes)` returns every node's desired engines. Rules, in order:

1. Stability. An existing assignment stays on its node while it is still valid: its deployment exists
   with the same class revision and role, and the node's labels still match the deployment's placement.
   A node being down or cordoned does not make it invalid: the data plane outlives the control plane, so a
   down node keeps its engines and they are never moved away automatically.
2. Retiring is draining. An assignment that is no longer wanted (deployment deleted, class or role changed,
   labels no longer match, scaled down, node drained, or an operator drained the engine) stays in the plan
   with `drain=True`, so the agent drains it, until the node reports the engine stopped (or, having applied
   the latest assignment, no longer reports it). Only then is it dropped. A down node's drained
   assignments are kept: nothing about a node that cannot be heard from is decided here.
3. New engines go to nodes that are up, not cordoned or draining, whose labels match the placement, and
   that have a free slot (`capacity_engines` counts every assignment on the node, draining ones too);
   spread first (fewest engines of this deployment), then least loaded, then by name. Names are
   `<deployment>-<index>` with the smallest index not in use on any node.

Scale-down retires the highest indexes. Deployments are placed in name order, so the plan is deterministic.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from engine.contract import FINISHED_STATES
from fleetctl.replica_class import ReplicaClassSpec


@dataclass(frozen=True)
class PlannedEngine:
    """One engine a node should run, as placement plans it: the contract's EngineAssignment without the spec,
    plus the deployment it serves. `to_contract` makes the wire form."""

    name: str
    deployment: str
    model: str
    class_ref: str
    role: str
    drain: bool = False

    def key(self) -> tuple[str, str, str, str, str, bool]:
        return (self.name, self.deployment, self.model, self.class_ref, self.role, self.drain)

    def to_contract(self, spec: ReplicaClassSpec | Mapping[str, Any], planted_fault: str | None = None) -> dict[str, Any]:
        """The EngineAssignment JSON; `planted_fault` is an active plant drill's fault (drills.py), not
        placement's: placement never plans one."""
        spec_json = spec.model_dump(mode="json") if isinstance(spec, ReplicaClassSpec) else dict(spec)
        return {"name": self.name, "model": self.model, "class_ref": self.class_ref, "spec": spec_json,
                "role": self.role, "drain": self.drain, "planted_fault": planted_fault}


@dataclass(frozen=True)
class DeploymentView:
    name: str
    model: str
    class_ref: str
    role: str
    replicas: int
    placement: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    capacity_engines: int = 1
    state: str = "up"  # up | down
    cordoned: bool = False
    draining: bool = False
    assignments: tuple[PlannedEngine, ...] = ()
    observed: Mapping[str, str] = field(default_factory=dict)  # engine name -> reported state
    generation: int = 0
    applied_generation: int = 0

    @property
    def schedulable(self) -> bool:
        return self.state == "up" and not self.cordoned and not self.draining


Plan = dict[str, list[PlannedEngine]]


def labels_match(labels: Mapping[str, str], placement: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in placement.items())


def engine_index(name: str) -> int:
    match = re.search(r"-(\d+)$", name)
    return int(match.group(1)) if match else -1


def plan_assignments(
    deployments: Iterable[DeploymentView],
    classes: Mapping[str, Any],
    nodes: Iterable[NodeView],
) -> Plan:
    """Every node's desired engines (sorted by name). `classes` holds the known class refs; a deployment
    whose class is unknown gets no new engines (validation keeps that from happening)."""
    node_list = sorted(nodes, key=lambda n: n.name)
    wanted = {d.name: d for d in deployments}
    plan: Plan = {node.name: _carry_over(node, wanted) for node in node_list}
    used = {a.name for node in node_list for a in node.assignments} | {n for node in node_list for n in node.observed}
    for deployment in sorted(wanted.values(), key=lambda d: d.name):
        _scale(deployment, plan, node_list, used, known_class=deployment.class_ref in classes)
    return {name: sorted(assignments, key=lambda a: a.name) for name, assignments in plan.items()}


def _carry_over(node: NodeView, wanted: Mapping[str, DeploymentView]) -> list[PlannedEngine]:
    """The node's existing assignments: kept, turned into drains, or (drain finished) dropped."""
    kept = []
    for assignment in node.assignments:
        if assignment.drain:
            if not _drain_finished(node, assignment.name):
                kept.append(assignment)
        elif node.draining or not _still_valid(assignment, node, wanted.get(assignment.deployment)):
            kept.append(replace(assignment, drain=True))
        else:
            kept.append(assignment)
    return kept


def _still_valid(assignment: PlannedEngine, node: NodeView, deployment: DeploymentView | None) -> bool:
    return (
        deployment is not None
        and deployment.class_ref == assignment.class_ref
        and deployment.role == assignment.role
        and labels_match(node.labels, deployment.placement)
    )


def _drain_finished(node: NodeView, engine: str) -> bool:
    if node.state != "up":
        return False
    state = node.observed.get(engine)
    if state is None:
        return node.applied_generation >= node.generation
    return state in FINISHED_STATES


def _scale(deployment: DeploymentView, plan: Plan, nodes: list[NodeView], used: set[str], known_class: bool) -> None:
    active = sorted(
        ((node, a) for node, assignments in plan.items() for a in assignments
         if a.deployment == deployment.name and not a.drain),
        key=lambda pair: engine_index(pair[1].name),
    )
    for node, assignment in active[deployment.replicas:]:
        _swap(plan[node], assignment, replace(assignment, drain=True))
    missing = deployment.replicas - len(active)
    for _ in range(missing if known_class else 0):
        node = _pick_node(deployment, plan, nodes)
        if node is None:
            return  # no capacity: the rest stays pending until a node frees up or joins
        name = _next_name(deployment.name, used)
        used.add(name)
        plan[node].append(PlannedEngine(name, deployment.name, deployment.model, deployment.class_ref, deployment.role))


def _swap(assignments: list[PlannedEngine], old: PlannedEngine, new: PlannedEngine) -> None:
    assignments[assignments.index(old)] = new


def _pick_node(deployment: DeploymentView, plan: Plan, nodes: list[NodeView]) -> str | None:
    candidates = [
        node.name for node in nodes
        if node.schedulable and labels_match(node.labels, deployment.placement)
        and len(plan[node.name]) < node.capacity_engines
    ]
    if not candidates:
        return None

    def load(name: str) -> tuple[int, int, str]:
        mine = sum(1 for a in plan[name] if a.deployment == deployment.name and not a.drain)
        return (mine, len(plan[name]), name)

    return min(candidates, key=load)


def _next_name(deployment: str, used: set[str]) -> str:
    index = 0
    while f"{deployment}-{index}" in used:
        index += 1
    return f"{deployment}-{index}"


def nodes_gone_quiet(nodes: Iterable[tuple[str, str, datetime]], now: datetime, down_after_s: float) -> list[str]:
    """Names of nodes (name, state, last_heartbeat_at) that are up but have missed heartbeats for too long."""
    cutoff = now - timedelta(seconds=down_after_s)
    return sorted(name for name, state, last in nodes if state == "up" and last < cutoff)


def changed_nodes(current: Mapping[str, Iterable[PlannedEngine]], plan: Plan) -> list[str]:
    """Nodes whose planned assignment differs from the stored one (their generation must advance)."""
    def keys(assignments: Iterable[PlannedEngine]) -> list[tuple[Any, ...]]:
        return sorted(a.key() for a in assignments)

    return sorted(name for name, planned in plan.items() if keys(planned) != keys(current.get(name, ())))
