"""The agent's side of the agent <-> controller contract (docs/contracts.md), as pydantic models.

`EngineAssignment` is what the controller wants on this node (from the heartbeat reply); `EngineObserved` is
what runs (sent on every heartbeat and served by the local API). Field names and meanings are the contract's;
the controller keeps its own copy of the schema, so unknown fields from it are ignored, never fatal.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["mixed", "prefill", "decode"]
EngineState = Literal["starting", "ready", "draining", "stopped", "failed"]
RUNNING_STATES: frozenset[str] = frozenset({"starting", "ready"})


class EngineAssignment(BaseModel):
    """One engine the controller wants on this node. `spec` is the replica class (ReplicaClassSpec JSON)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(description="stable engine name, <deployment>-<index>")
    model: str = Field(description="the name clients ask for")
    class_ref: str = Field(description="the replica class revision, NAME@rN")
    spec: dict[str, Any] = Field(description="the replica class's fields")
    role: Role = "mixed"
    drain: bool = Field(default=False, description="stop taking requests, finish in-flight ones, then exit")


class EngineMetrics(BaseModel):
    """Key load figures scraped from the engine's /metrics (vLLM v1 names), summed over its DP ranks."""

    num_requests_running: float = 0
    num_requests_waiting: float = 0
    kv_cache_usage_perc: float = Field(default=0.0, description="a fraction in 0..1, as vLLM reports it")
    prefix_cache_queries: float = Field(default=0, description="tokens looked up in the prefix cache (counter)")
    prefix_cache_hits: float = Field(default=0, description="tokens found there (counter)")


class EngineObserved(BaseModel):
    """One engine as it runs on this node."""

    model_config = ConfigDict(extra="ignore")

    name: str
    model: str
    class_ref: str
    role: Role
    state: EngineState
    pid: int | None = None
    port: int | None = None
    url: str | None = None
    kv_events_endpoint: str | None = None
    restarts: int = Field(default=0, description="times the agent restarted this engine")
    last_exit: str | None = Field(default=None, description="how the last process ended, e.g. 'signal SIGKILL', 'exit 1'")
    metrics: EngineMetrics = Field(default_factory=EngineMetrics, description="zeros until the first scrape")
