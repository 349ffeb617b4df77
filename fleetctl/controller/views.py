"""Read models: engines (desired joined with observed), fleet status, and the gateway's routing table.

Each is built from a handful of whole-table queries, so `GET /api/v1/status` stays one call for a
1,000-node fleet.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.contract import RUNNING_STATES
from fleetctl.controller import adoption, drift, drill_effects, flags, gateways, routing_generation
from fleetctl.controller.deployments import deployment_view
from fleetctl.controller.models import (
    AdoptedEngine, Assignment, ClassRevision, Deployment, Engine, FeatureFlag, Node, TrafficPolicy,
)
from fleetctl.controller.nodes import node_view
from fleetctl.errors import NotFound

PENDING = "pending"  # assigned, not yet reported by the agent


def engines(session: Session, now: datetime, node: str | None = None, name: str | None = None) -> list[dict[str, Any]]:
    """Every assigned or reported engine, and every adopted one: the assignment's intent with the agent's last
    report, and whether a live gateway finds it hashing prefixes with another seed."""
    assigned_q, observed_q = select(Assignment), select(Engine)
    if node is not None:
        assigned_q, observed_q = assigned_q.where(Assignment.node == node), observed_q.where(Engine.node == node)
    if name is not None:
        assigned_q, observed_q = assigned_q.where(Assignment.name == name), observed_q.where(Engine.name == name)
    assigned = {(a.node, a.name): a for a in session.execute(assigned_q).scalars()}
    observed = {(e.node, e.name): e for e in session.execute(observed_q).scalars()}
    keys = sorted(set(assigned) | set(observed), key=lambda k: (k[1], k[0]))
    differences = _drift(session, observed.values())
    found = [_engine_view(assigned.get(key), observed.get(key), differences.get(key)) for key in keys]
    if node in (None, adoption.ADOPTED_NODE):
        found += [_adopted_view(row) for row in adoption.adopted_engines(session) if name in (None, row.name)]
    flagged = gateways.hash_mismatched(session, now)
    return [{**view, "hash_mismatch": view["name"] in flagged} for view in found]


def _drift(session: Session, observed: Any) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(node, name) -> the differences of each running engine from its class revision (drift.py)."""
    running = [e for e in observed if e.state in RUNNING_STATES]
    specs = drift.class_specs(session, {e.class_ref for e in running})
    return {(e.node, e.name): [d.as_dict() for d in drift.drift_of_row(e, specs[e.class_ref]).drift]
            for e in running if e.class_ref in specs}


def engine(session: Session, name: str, now: datetime) -> dict[str, Any]:
    found = engines(session, now, name=name)
    if not found:
        raise NotFound(f"no engine {name!r}", field="engine")
    assigned = [e for e in found if e["deployment"] is not None]
    return (assigned or found)[0]


def _engine_view(a: Assignment | None, e: Engine | None, differences: list[dict[str, Any]] | None) -> dict[str, Any]:
    source: Any = e if e is not None else a
    return {
        "name": source.name, "node": source.node, "deployment": a.deployment if a else None,
        "model": source.model, "class_ref": source.class_ref, "role": source.role,
        "state": e.state if e else PENDING, "drain": a.drain if a else False,
        "cordoned": a.cordoned if a else False,
        "url": e.url if e else None, "port": e.port if e else None, "pid": e.pid if e else None,
        "kv_events_endpoint": e.kv_events_endpoint if e else None,
        "restarts": e.restarts if e else 0, "last_exit": e.last_exit if e else None,
        "metrics": e.metrics if e else {}, "updated_at": e.updated_at.isoformat() if e else None,
        "drift": differences or [], "adopted": False,
    }


def _adopted_view(row: AdoptedEngine) -> dict[str, Any]:
    """An adopted engine as an engine view: on no agent's node, in no deployment, never restarted by us."""
    return {
        "name": row.name, "node": adoption.ADOPTED_NODE, "deployment": None, "model": row.model,
        "class_ref": row.class_ref, "role": row.role, "state": row.state, "drain": row.state == adoption.DRAINING,
        "cordoned": False, "url": row.url, "port": None, "pid": None, "kv_events_endpoint": row.kv_events_endpoint,
        "restarts": 0, "last_exit": row.last_error, "metrics": row.metrics, "updated_at": row.checked_at.isoformat(),
        "drift": [], "adopted": True,
    }


def nodes(session: Session, now: datetime) -> list[dict[str, Any]]:
    counts = Counter(session.execute(select(Assignment.node)).scalars())
    return [node_view(n, now, counts[n.name]) for n in session.execute(select(Node).order_by(Node.name)).scalars()]


def deployments(session: Session, engine_views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    placed: Counter[str] = Counter()
    ready: Counter[str] = Counter()
    for view in engine_views:
        if view["deployment"] and not view["drain"]:
            placed[view["deployment"]] += 1
            ready[view["deployment"]] += view["state"] == "ready"
    rows = session.execute(select(Deployment).order_by(Deployment.name)).scalars()
    return [
        {**deployment_view(d), "placed": placed[d.name], "ready": ready[d.name], "pending": max(d.replicas - placed[d.name], 0)}
        for d in rows
    ]


def status(session: Session, now: datetime, leader: bool) -> dict[str, Any]:
    engine_views = engines(session, now)
    return {
        "controller": {"leader": leader, "at": now.isoformat()},
        "nodes": nodes(session, now),
        "engines": engine_views,
        "deployments": deployments(session, engine_views),
        "drifted": sum(bool(view["drift"]) for view in engine_views),
        "gateways": gateways.list_gateways(session, now),
        "break_glass": flags.break_glass(session, now),
    }


def routing(session: Session) -> dict[str, Any]:
    """The gateway's table (docs/contracts.md). `generation` is a counter that advances whenever the rest,
    engines' metrics aside, changes (routing_generation.py): a later table has a larger generation."""
    generation, table = routing_generation.stamp(session, lambda: routing_content(session))
    return {"generation": generation, **table}


def routing_content(session: Session) -> dict[str, Any]:
    """The routing table without its generation."""
    deps = list(session.execute(select(Deployment).order_by(Deployment.name)).scalars())
    policies = {p.model: p.weights for p in session.execute(select(TrafficPolicy)).scalars()}
    specs = {c.ref: c.spec for c in session.execute(select(ClassRevision)).scalars()}
    adopted = adoption.adopted_engines(session)
    return {
        "models": _models(deps, policies, specs, drill_effects.misroutes(session), adopted),
        "engines": _routing_engines(session) + [_adopted_route(row) for row in adopted],
        "flags": {f.name: f.value for f in session.execute(select(FeatureFlag).order_by(FeatureFlag.name)).scalars()},
    }


def _models(deps: list[Deployment], policies: dict[str, dict[str, Any]], specs: dict[str, Any],
            misroutes: dict[str, drill_effects.Misroute], adopted: list[AdoptedEngine]) -> dict[str, Any]:
    """Each model's traffic (its policy, else every deployed or adopted revision equally), with a misroute
    drill in effect applied on top: gateways send the drill's fraction to its target with no change of their
    own, while the stored policy keeps the operator's weights."""
    roles: dict[str, set[str]] = defaultdict(set)
    deployed: dict[str, dict[str, float]] = defaultdict(dict)
    for d in deps:
        if d.replicas > 0:
            roles[d.model].add(d.role)
            deployed[d.model][d.class_ref] = 1.0
    for row in adopted:
        roles[row.model].add(row.role)
        deployed[row.model][row.class_ref] = 1.0
    models = {}
    for model in sorted(set(deployed) | set(policies)):
        traffic = {ref: float(w) for ref, w in (policies.get(model) or deployed[model]).items()}
        if model in misroutes:
            drill = misroutes[model]
            traffic = drill_effects.misrouted_weights(traffic, drill.to_ref, drill.fraction)
        models[model] = {
            "traffic": traffic,
            "pd": {"prefill", "decode"} <= roles[model],
            "classes": {ref: specs[ref] for ref in sorted(set(traffic) | set(deployed[model])) if ref in specs},
        }
    return models


def _adopted_route(row: AdoptedEngine) -> dict[str, Any]:
    return {"name": row.name, "node": adoption.ADOPTED_NODE, "model": row.model, "class_ref": row.class_ref,
            "role": row.role, "url": row.url, "state": row.state, "kv_events_endpoint": row.kv_events_endpoint,
            "metrics": row.metrics, "cordoned": False}


def _routing_engines(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(select(Engine).order_by(Engine.name, Engine.node)).scalars()
    cordoned = set(session.execute(
        select(Assignment.node, Assignment.name).where(Assignment.cordoned.is_(True))).tuples())
    return [
        {"name": e.name, "node": e.node, "model": e.model, "class_ref": e.class_ref, "role": e.role, "url": e.url,
         "state": e.state, "kv_events_endpoint": e.kv_events_endpoint, "metrics": e.metrics,
         "cordoned": (e.node, e.name) in cordoned}
        for e in rows
    ]
