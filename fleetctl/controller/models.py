"""The SQL schema (SQLAlchemy 2 ORM). Alembic migrations in migrations/ must produce exactly this;
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

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, TypeDecorator, UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column


class UTCDateTime(TypeDecorator[datetime]):
    """timestamptz on PostgreSQL; on SQLite (no time zones) values come back naive and are read as UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: use datetime.now(timezone.utc)")
        return value.astimezone(timezone.utc) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Versioned:
    """An object operators change: `version` advances with every change, and an UPDATE or DELETE of a row
    whose version moved since it was read matches no row (StaleDataError, the API's 409). So a concurrent
    writer never overwrites a change it did not see; the API serves the version as the ETag."""

    version: Mapped[int] = mapped_column(Integer, default=1)

    @declared_attr.directive
    def __mapper_args__(cls) -> dict[str, Any]:
        return {"version_id_col": cls.__table__.c.version}


NAME = 63  # DNS-label length: node, engine, class, deployment and token names
FLAG_KEY = 264  # a flag's key: its name, ':' and a model name (at most 200)
REF = 80  # NAME@rN


class Node(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    url: Mapped[str] = mapped_column(String(500))
    labels: Mapped[dict[str, Any]]
    capacity_engines: Mapped[int] = mapped_column(Integer)
    capacity_kv_mib: Mapped[int] = mapped_column(Integer)
    agent_version: Mapped[str] = mapped_column(String(100))
    state: Mapped[str] = mapped_column(String(16))  # up | down
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    draining: Mapped[bool] = mapped_column(Boolean, default=False)
    registered_at: Mapped[datetime]
    last_heartbeat_at: Mapped[datetime]
    cut_off_s: Mapped[float | None] = mapped_column(Float)  # what the agent said about its last outage
    generation: Mapped[int] = mapped_column(Integer, default=0)  # of the desired assignment
    applied_generation: Mapped[int] = mapped_column(Integer, default=0)  # last one the agent applied


class Assignment(Base):
    """One engine the reconciler wants on a node. The spec is read from class_revisions (immutable)."""

    __tablename__ = "assignments"

    name: Mapped[str] = mapped_column(String(NAME + 12), primary_key=True)  # <deployment>-<index>
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name"), index=True)
    deployment: Mapped[str] = mapped_column(String(NAME), index=True)  # may outlive its deployment while draining
    model: Mapped[str] = mapped_column(String(200))
    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    role: Mapped[str] = mapped_column(String(16))
    drain: Mapped[bool] = mapped_column(Boolean, default=False)
    # cordoned: it keeps running and counting as a replica, but the gateways route no new request to it
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Engine(Base):
    """An engine as its agent last reported it. Replaced per node on each heartbeat, never by anyone else."""

    __tablename__ = "engines"

    node: Mapped[str] = mapped_column(ForeignKey("nodes.name"), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME + 12), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    class_ref: Mapped[str] = mapped_column(String(REF))
    role: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    pid: Mapped[int | None] = mapped_column(Integer)
    port: Mapped[int | None] = mapped_column(Integer)
    url: Mapped[str | None] = mapped_column(String(500))
    kv_events_endpoint: Mapped[str | None] = mapped_column(String(500))
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    last_exit: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]]
    launched: Mapped[dict[str, Any] | None]  # LaunchedCommand: argv and env the agent launched it with
    reported: Mapped[dict[str, Any] | None]  # ReportedConfig: the engine's own account of its settings
    updated_at: Mapped[datetime]


class ClassRevision(Base):
    """Immutable. Content-addressed: (name, digest) is unique, so identical content is the same revision."""

    __tablename__ = "class_revisions"
    __table_args__ = (UniqueConstraint("name", "revision"), UniqueConstraint("name", "digest"))

    ref: Mapped[str] = mapped_column(String(REF), primary_key=True)  # NAME@rN
    name: Mapped[str] = mapped_column(String(NAME), index=True)
    revision: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME))


class Deployment(Versioned, Base):
    __tablename__ = "deployments"

    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    role: Mapped[str] = mapped_column(String(16))  # mixed | prefill | decode
    replicas: Mapped[int] = mapped_column(Integer)
    placement: Mapped[dict[str, Any]]  # node labels that must all match
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(NAME))


class TrafficPolicy(Versioned, Base):
    __tablename__ = "traffic_policies"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    weights: Mapped[dict[str, Any]]  # class_ref -> weight
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(NAME))


class RoutingState(Base):
    """One row (id 1): the routing table's generation, a counter that advances whenever the table's content
    (digest) changes, so gateways' reports can be compared ("at or past generation G")."""

    __tablename__ = "routing_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation: Mapped[int] = mapped_column(BigInteger)
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of the table content that has `generation`


class Gateway(Base):
    """A gateway as it last reported itself: the routing-table generation it applied and when."""

    __tablename__ = "gateways"

    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    url: Mapped[str | None] = mapped_column(String(500))
    generation: Mapped[int] = mapped_column(BigInteger)  # of the routing table it applied
    table_age_s: Mapped[float] = mapped_column(Float)  # that table's age when reported
    refresh_interval_s: Mapped[float] = mapped_column(Float)  # how often it refreshes (and reports)
    first_seen_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
    reported_by: Mapped[str] = mapped_column(String(NAME + 2))  # the token that reported
    # class_ref -> cumulative counters (contract.ServedCountersModel) from its latest report; None: it never sent any
    served: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class FeatureFlag(Versioned, Base):
    """An override of a catalog flag (fleetctl/flag_catalog.py): `name` is its key (`NAME` or `NAME:MODEL`).
    Without a row a flag has its default; a row past `expires_at` no longer counts, and the flag reconciler
    deletes it."""

    __tablename__ = "feature_flags"

    name: Mapped[str] = mapped_column(String(FLAG_KEY), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(NAME))  # the owner: who set it last
    reason: Mapped[str | None] = mapped_column(Text)
    expires_at: Mapped[datetime | None]  # None: until unset


class AuditEvent(Base):
    """Append-only: written once per mutating call, never updated or deleted."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(NAME + 2), index=True)
    action: Mapped[str] = mapped_column(String(100))
    target: Mapped[str] = mapped_column(String(300))
    reason: Mapped[str | None] = mapped_column(Text)
    payload_digest: Mapped[str] = mapped_column(String(64))
    result: Mapped[str] = mapped_column(String(16))  # ok | noop | refused | error
    code: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    detail: Mapped[dict[str, Any] | None]  # what a guard let through, e.g. an allowed correctness change


class ApiToken(Base):
    """Only the sha256 of a token is stored. Revoked tokens stay (revoked_at set) for the audit trail."""

    __tablename__ = "api_tokens"

    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))  # viewer | operator | admin | agent
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME + 2))
    revoked_at: Mapped[datetime | None]


class Rollout(Versioned, Base):
    """A phased move of a model's traffic from class revision A (`from_ref`) to B (`to_ref`).

    `spec` is the RolloutSpec as written (aliases), with `from` resolved; `state` is RolloutState.to_json().
    `active_model` is the model while the rollout is not terminal and NULL once it is: being UNIQUE, it
    keeps one rollout per model at a time even when two controllers race to start one. Writes are
    compare-and-set on `version` (an operator command and the reconciler never overwrite each other)."""

    __tablename__ = "rollouts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    from_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    to_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    spec: Mapped[dict[str, Any]]
    state: Mapped[dict[str, Any]]
    phase: Mapped[str] = mapped_column(String(16), index=True)
    active_model: Mapped[str | None] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME + 2))
    updated_at: Mapped[datetime]


class RolloutEvent(Base):
    """Append-only: one line of a rollout's history (started, step, weights, paused, aborted, ...)."""

    __tablename__ = "rollout_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollouts.id"), index=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(NAME + 2))
    event: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


# --- the quality canary (fleetctl/canary) ---------------------------------------------------------------------

class GoldenSetRow(Base):
    """A golden set as uploaded (canary.types.GoldenSet as JSON), one row per (name, version); never changed."""

    __tablename__ = "golden_sets"

    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of the canonical JSON body
    body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME + 2))


class CanaryReference(Base):
    """A reference recorded from a class revision (canary.types.Reference as JSON). The newest per
    (model, class_ref) is the one in use; older ones stay for the history."""

    __tablename__ = "canary_references"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    golden_set: Mapped[str] = mapped_column(String(NAME))
    golden_version: Mapped[int] = mapped_column(Integer)
    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    correctness_digest: Mapped[str] = mapped_column(String(64))
    body: Mapped[dict[str, Any]]
    recorded_at: Mapped[datetime]
    recorded_by: Mapped[str] = mapped_column(String(NAME + 2))


class CanaryProbe(Base):
    """Append-only: one scored probe (canary.types.ProbeRecord). Pruned by age, never edited."""

    __tablename__ = "canary_probes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # pinned | production
    class_ref: Mapped[str | None] = mapped_column(String(REF))
    engine: Mapped[str | None] = mapped_column(String(NAME))
    condition: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int | None] = mapped_column(Integer)
    prompt_id: Mapped[str] = mapped_column(String(NAME))
    reference_id: Mapped[int | None] = mapped_column(Integer)
    score: Mapped[dict[str, Any] | None]
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)


class CanaryStream(Base):
    """One stream's sequential-test state and verdict (canary.types.StreamState as JSON). `key` is
    StreamKey.label-like: 'model|kind|class_ref|condition' with '' for the production stream's None parts."""

    __tablename__ = "canary_streams"

    key: Mapped[str] = mapped_column(String(400), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    class_ref: Mapped[str | None] = mapped_column(String(REF))
    condition: Mapped[int | None] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(16))
    since: Mapped[datetime | None]
    state: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime]


class CanaryEvent(Base):
    """Append-only: a verdict change (an alert when it turns drifting or failing, a recovery when it turns back)."""

    __tablename__ = "canary_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    class_ref: Mapped[str | None] = mapped_column(String(REF))
    condition: Mapped[int | None] = mapped_column(Integer)
    verdict_from: Mapped[str] = mapped_column(String(16))
    verdict_to: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any] | None]


class Drill(Base):
    """A time-bound fault drill: `misroute` (a fraction of a model's traffic to another class revision) or
    `plant` (one engine restarted with a hidden numeric fault). Active while stopped_at is NULL and
    ends_at is in the future."""

    __tablename__ = "drills"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # misroute | plant
    model: Mapped[str] = mapped_column(String(200), index=True)
    target_ref: Mapped[str | None] = mapped_column(String(REF))  # misroute: where the fraction goes
    fraction: Mapped[float | None] = mapped_column(Float)
    engine: Mapped[str | None] = mapped_column(String(NAME))  # plant: the engine
    fault: Mapped[str | None] = mapped_column(String(32))  # plant: engine.contract.faults name
    started_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    stopped_at: Mapped[datetime | None]
    stopped_by: Mapped[str | None] = mapped_column(String(NAME + 2))
    created_by: Mapped[str] = mapped_column(String(NAME + 2))


class DirectActionRow(Base):
    """A direct (break-glass) action an agent or a gateway did without the controller, as the node uploaded
    it (engine.contract.direct). `open`: the node still holds it in force (as of its last upload).
    `state`: pending (diverges from desired state until the operator adopts or reverts it), adopted,
    reverted, matches (desired state already agrees) or done (nothing left in force, e.g. a restart)."""

    __tablename__ = "direct_actions"
    __table_args__ = (UniqueConstraint("source_kind", "source", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source_kind: Mapped[str] = mapped_column(String(16))  # agent | gateway
    source: Mapped[str] = mapped_column(String(200))
    seq: Mapped[int] = mapped_column(BigInteger)
    at: Mapped[datetime]  # when the node did it
    received_at: Mapped[datetime]
    action: Mapped[str] = mapped_column(String(200))
    target: Mapped[str] = mapped_column(String(300))
    value: Mapped[Any | None] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(Text)
    open: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16))
    resolved_at: Mapped[datetime | None]
    resolved_by: Mapped[str | None] = mapped_column(String(NAME + 2))


class RebalanceRow(Versioned, Base):
    """A P:D rebalance: one class revision's engines flipped between roles, one at a time, to a target ratio.

    `spec` is rebalance.state.RebalanceSpec, `state` RebalanceState.to_json(). `active` is "pd" while the
    rebalance is not terminal and NULL once it is: being UNIQUE, it keeps one rebalance in the fleet at a
    time, even between two controllers racing to start one. Writes are compare-and-set on `version`."""

    __tablename__ = "rebalances"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    spec: Mapped[dict[str, Any]]
    state: Mapped[dict[str, Any]]
    phase: Mapped[str] = mapped_column(String(16), index=True)
    active: Mapped[str | None] = mapped_column(String(8), unique=True)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME + 2))
    updated_at: Mapped[datetime]


class RebalanceEvent(Base):
    """Append-only: one line of a rebalance's history (started, baseline, flip_started, flip_done, ...)."""

    __tablename__ = "rebalance_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rebalance_id: Mapped[int] = mapped_column(ForeignKey("rebalances.id"), index=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(NAME + 2))
    event: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


class PdModelSettings(Versioned, Base):
    """The P:D planner's settings for one model (a model without a row has the defaults: mode off)."""

    __tablename__ = "pd_models"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16))  # off | advisory | auto
    floor_prefill: Mapped[int] = mapped_column(Integer)
    floor_decode: Mapped[int] = mapped_column(Integer)
    ttft_slo_s: Mapped[float] = mapped_column(Float)
    itl_slo_s: Mapped[float] = mapped_column(Float)
    headroom: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(NAME + 2))


class PdProfile(Base):
    """What one engine of a class revision does within the SLOs, as `fleetctl pd profile` measured it:
    prefill tokens per second and decode slots, with the sweep's points in `detail`."""

    __tablename__ = "pd_profiles"

    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"), primary_key=True)
    prefill_tokens_per_s: Mapped[float] = mapped_column(Float)
    decode_slots: Mapped[float] = mapped_column(Float)
    detail: Mapped[dict[str, Any]]
    measured_at: Mapped[datetime]
    measured_by: Mapped[str] = mapped_column(String(NAME + 2))
