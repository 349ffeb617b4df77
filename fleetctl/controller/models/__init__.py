"""The SQL schema (SQLAlchemy 2 ORM), one module per area, every table importable from here. Alembic migrations in migrations/ must produce exactly this;
tests/controller/test_migrations.py compares the two.

Desired state: class_revisions, deployments, traffic_policies, feature_flags, and the reconciler's output,
assignments. Observed state: nodes (registration, heartbeat), engines (what agents report) and gateways
(which routing table each applied, and what each served per class revision). Rollouts: rollouts (spec and
the machine's persisted state) and rollout_events (append-only history). Bookkeeping: api_tokens,
audit_events (append-only), routing_state (the routing table's generation counter). The quality canary:
golden_sets, canary_references, canary_probes, canary_streams, canary_events and drills. Break-glass:
direct_actions (what agents and gateways did without the controller, uploaded when it is back). P:D:
rebalances (spec and the role-flip machine's persisted state), rebalance_events (append-only history),
pd_models (the planner's settings per model) and pd_profiles (what an engine of a class revision does).
"""

from __future__ import annotations

from fleetctl.controller.models.base import FLAG_KEY, NAME, REF, Base, UTCDateTime, Versioned
from fleetctl.controller.models.canary import (
    CanaryEvent, CanaryProbe, CanaryReference, CanaryStream, Drill, GoldenSetRow,
)
from fleetctl.controller.models.fleet import (
    AdoptedEngine, Assignment, ClassRevision, Deployment, Engine, Gateway, Node, RoutingState, TrafficPolicy,
)
from fleetctl.controller.models.operations import ApiToken, AuditEvent, DirectActionRow, FeatureFlag
from fleetctl.controller.models.pd import PdModelSettings, PdProfile, RebalanceEvent, RebalanceRow
from fleetctl.controller.models.rollouts import Rollout, RolloutEvent

__all__ = [
    "FLAG_KEY",
    "NAME",
    "REF",
    "Base",
    "UTCDateTime",
    "Versioned",
    "AdoptedEngine",
    "Assignment",
    "ClassRevision",
    "Deployment",
    "Engine",
    "Gateway",
    "Node",
    "RoutingState",
    "TrafficPolicy",
    "ApiToken",
    "AuditEvent",
    "DirectActionRow",
    "FeatureFlag",
    "Rollout",
    "RolloutEvent",
    "CanaryEvent",
    "CanaryProbe",
    "CanaryReference",
    "CanaryStream",
    "Drill",
    "GoldenSetRow",
    "PdModelSettings",
    "PdProfile",
    "RebalanceEvent",
    "RebalanceRow",
]
