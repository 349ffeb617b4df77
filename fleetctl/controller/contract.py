"""Wire types of the agent <-> controller and gateway <- controller contracts (docs/contracts.md).

Requests are validated completely; a bad field is a 422 naming it. Unknown fields from agents are
ignored (not refused), so a newer agent can still talk to an older controller during an upgrade.
Responses are described here so the OpenAPI schema documents them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.contract import EngineAssignment, EngineObserved
from engine.contract.bounds import Count, Count32, NonNegative, SafeStr, Seconds, Url
from engine.contract.kv_tier_report import MAX_TIER_REPORTS, KVDirectives, KVFlushDone, TierReport
from fleetctl.controller.schemas import ClassRef, LabelMap, Name, NonBlank

AGENT_INPUT = ConfigDict(extra="ignore")


class Capacity(BaseModel):
    model_config = AGENT_INPUT

    engines: int = Field(ge=0, le=10_000, description="how many engines the node may run")
    kv_mib: Count32 = Field(description="KV memory the node offers, MiB")


class RegisterRequest(BaseModel):
    model_config = AGENT_INPUT

    node: Name
    url: NonBlank = Field(description="the agent's base URL")
    labels: LabelMap = Field(default_factory=dict)
    capacity: Capacity
    agent_version: Annotated[SafeStr, Field(max_length=100)] = ""


class RegisterResponse(BaseModel):
    node: str
    heartbeat_interval_s: float
    generation: int


class HeartbeatRequest(BaseModel):
    model_config = AGENT_INPUT

    node: Name
    generation: Count32 = Field(description="the last assignment generation the agent applied")
    engines: list[EngineObserved] = Field(default_factory=list, max_length=10_000)
    cut_off_s: Seconds | None = Field(default=None, description="seconds unreachable before this beat")
    kv_tiers: list[TierReport] = Field(default_factory=list, max_length=MAX_TIER_REPORTS,
                                       description="the node's KV tiers, one per class and tier")
    kv_flushed: KVFlushDone | None = Field(default=None, description="the last flush the agent carried out")

    @field_validator("engines")
    @classmethod
    def _unique_names(cls, engines: list[EngineObserved]) -> list[EngineObserved]:
        names = [engine.name for engine in engines]
        if len(set(names)) != len(names):
            raise ValueError("engine names must be unique")
        return engines


class HeartbeatResponse(BaseModel):
    generation: int
    assignment: list[EngineAssignment]
    heartbeat_interval_s: float
    kv: KVDirectives = Field(default_factory=KVDirectives, description="the node's KV tiers: the disk flag, a flush")


class RoutingModel(BaseModel):
    traffic: dict[str, float]
    pd: bool
    classes: dict[str, dict[str, Any]]


class RoutingEngine(BaseModel):
    name: str
    node: str
    model: str
    class_ref: str
    role: str
    url: str | None
    state: str
    kv_events_endpoint: str | None
    metrics: dict[str, Any]
    cordoned: bool = False  # held out of traffic by an operator: no new request but a probe naming it


class RoutingTable(BaseModel):
    generation: int
    models: dict[str, RoutingModel]
    engines: list[RoutingEngine]
    flags: dict[str, Any]


MAX_SERVED_CLASSES = 256
MAX_FLAGGED_ENGINES = 4096
MAX_BUCKETS = 64


class HistogramModel(BaseModel):
    """Cumulative buckets (rollout.state.Histogram): `counts[i]` observations <= `bounds[i]`, `count` in all."""

    model_config = AGENT_INPUT

    bounds: list[NonNegative] = Field(default_factory=list, max_length=MAX_BUCKETS,
                                      description="bucket upper bounds, seconds, increasing (+Inf is implied)")
    counts: list[Count] = Field(default_factory=list, max_length=MAX_BUCKETS,
                                description="cumulative count per bound, non-decreasing")
    count: Count = 0
    sum: NonNegative = 0.0

    @model_validator(mode="after")
    def _cumulative(self) -> "HistogramModel":
        if len(self.counts) != len(self.bounds):
            raise ValueError(f"counts: {len(self.counts)} counts for {len(self.bounds)} bounds")
        if any(b >= a for a, b in zip(self.bounds[1:], self.bounds)):
            raise ValueError("bounds: must be strictly increasing")
        if any(b > a for a, b in zip(self.counts[1:], self.counts)):
            raise ValueError("counts: must be non-decreasing (cumulative)")
        if self.counts and self.counts[-1] > self.count:
            raise ValueError("count: must be at least the last bucket's count")
        return self


class ServedCountersModel(BaseModel):
    """What a gateway served from one class revision since it started (rollout.state.ServedCounters)."""

    model_config = AGENT_INPUT

    requests: Count = Field(description="requests answered, whatever the status")
    errors: Count = Field(default=0, description="5xx answers and streams that failed or were cut")
    rejections: Count = Field(default=0, description="429s: admission control or the engine's own")
    ttft: HistogramModel = Field(default_factory=HistogramModel, description="seconds, arrival to first token")
    itl: HistogramModel = Field(default_factory=HistogramModel, description="seconds, mean inter-token latency per stream")

    @model_validator(mode="after")
    def _within_requests(self) -> "ServedCountersModel":
        if self.errors > self.requests:
            raise ValueError("errors: must not exceed requests")
        if self.rejections > self.requests:
            raise ValueError("rejections: must not exceed requests")
        return self


class GatewayReport(BaseModel):
    """What a gateway reports after each routing-table refresh (`POST /api/v1/gateways/report`)."""

    model_config = AGENT_INPUT

    name: Name
    url: Url | None = Field(default=None, description="the gateway's base URL, if it has one")
    generation: int = Field(ge=0, le=2**63 - 1, description="generation of the routing table it applied")
    table_age_s: Seconds = Field(description="seconds since that table was fetched")
    refresh_interval_s: float | None = Field(
        default=None, gt=0, le=3600, allow_inf_nan=False,
        description="seconds between its refreshes (and reports); default 2. Stale after 3 missed",
    )
    served: dict[ClassRef, ServedCountersModel] | None = Field(
        default=None, max_length=MAX_SERVED_CLASSES,
        description="cumulative counters per class revision since the gateway started (rollout analysis)",
    )
    hash_mismatch: list[SafeStr] | None = Field(
        default=None, max_length=MAX_FLAGGED_ENGINES,
        description="engines whose KV events hash prefixes with another seed than this gateway's (no prefix "
        "routing to them); None from a gateway that does not check",
    )


class GatewayView(BaseModel):
    name: str
    url: str | None
    generation: int
    table_age_s: float
    refresh_interval_s: float
    first_seen: str
    last_seen: str
    seen_ago_s: float
    stale: bool
    reported_by: str
    hash_mismatch: list[str] = Field(default_factory=list, description="engines this gateway found hashing "
                                     "prefixes with another seed, as of its last report")
