"""Desired and observed fleet state: nodes, engines, assignments, class revisions, deployments, traffic
policies, gateways and the routing table's generation."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import Mapped, mapped_column

from fleetctl.controller.models.base import NAME, REF, Base, Versioned


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
    kv_tiers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # its latest TierReport rows
    kv_flush: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # a flush asked for, not yet done
    kv_flushed: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the last one done: KVFlushDone + by, at
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


class AdoptedEngine(Base):
    """An engine fleetctl did not launch (a vLLM server already running), registered by `fleetctl engine adopt`:
    routed, scraped and shown like the others, never started, stopped or restarted (adoption.py)."""

    __tablename__ = "adopted_engines"

    name: Mapped[str] = mapped_column(String(NAME + 12), primary_key=True)
    url: Mapped[str] = mapped_column(String(500))
    model: Mapped[str] = mapped_column(String(200))
    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    role: Mapped[str] = mapped_column(String(16))
    kv_events_endpoint: Mapped[str | None] = mapped_column(String(500))
    state: Mapped[str] = mapped_column(String(16))  # ready | unreachable | draining
    metrics: Mapped[dict[str, Any]]  # EngineMetrics, from its /metrics at the last probe
    reported: Mapped[dict[str, Any] | None]  # ReportedConfig: its own account of its settings, at adoption
    last_error: Mapped[str | None] = mapped_column(Text)  # why the last probe failed
    adopted_at: Mapped[datetime]
    adopted_by: Mapped[str] = mapped_column(String(NAME + 2))
    checked_at: Mapped[datetime]  # the last probe
    draining_since: Mapped[datetime | None]  # released: gateways route it nothing new from then on


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
    # engines whose KV events hash prefixes with another seed than the gateway's, from its latest report
    hash_mismatch: Mapped[list[str] | None] = mapped_column(JSON)
