"""`EngineObserved`: one engine as it runs on a node, and `EngineMetrics`, its load figures.

Agents send these on every heartbeat (and serve them on their local API); the controller stores them and
passes the metrics on to the gateways' routing table. Every field is bounded so what validates can be
stored: a PID is a PID, a port a port, `restarts` fits the 32-bit column, every figure is finite and
non-negative, every string fits its column (`fields`). Unknown fields are ignored, so a newer agent can talk
to an older controller; `launched` and `reported` (engine.contract.launched) default to None, so an older
agent's beat still validates.

`EngineMetrics` allows extra figures beyond the named ones (an agent may report more of an engine's
metrics; they pass through to the routing table): at most `MAX_EXTRA_METRICS`, each named by a
`METRIC_NAME` of at most `METRIC_NAME_MAX` characters, each a finite non-negative number.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.contract.bounds import Count32, Fraction, NonNegative, Pid, Port
from engine.contract.engine_state import EngineState, Role
from engine.contract.fields import ClassRef, EngineName, Endpoint, ExitText, ModelName
from engine.contract.launched import LaunchedCommand, ReportedConfig

MAX_EXTRA_METRICS = 64
METRIC_NAME_MAX = 100
METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_:.]*$")


class EngineMetrics(BaseModel):
    """Key load figures scraped from the engine's /metrics (vLLM v1 names), summed over its DP ranks."""

    model_config = ConfigDict(extra="allow")
    # The type of every extra figure (pydantic validates extras against it, naming the key on failure).
    __pydantic_extra__: dict[str, NonNegative] = Field(init=False)

    num_requests_running: NonNegative = 0
    num_requests_waiting: NonNegative = 0
    kv_cache_usage_perc: Fraction = Field(default=0.0, description="a fraction in 0..1, as vLLM reports it")
    prefix_cache_queries: NonNegative = Field(default=0, description="tokens looked up in the prefix cache (counter)")
    prefix_cache_hits: NonNegative = Field(default=0, description="tokens found there (counter)")
    # served tokens (the canary measures the fleet's busy capacity from them); an older agent sends none: 0
    prompt_tokens: NonNegative = Field(default=0, description="prompt tokens processed (counter)")
    generation_tokens: NonNegative = Field(default=0, description="tokens generated (counter)")
    # latency sums and counts of the TTFT and inter-token histograms (their means over a window are the
    # change stream's engine rates); an older agent sends none: 0
    ttft_seconds_sum: NonNegative = Field(default=0, description="seconds to first token, summed over requests (counter)")
    ttft_seconds_count: NonNegative = Field(default=0, description="requests with a first token (counter)")
    itl_seconds_sum: NonNegative = Field(default=0, description="inter-token seconds, summed over tokens (counter)")
    itl_seconds_count: NonNegative = Field(default=0, description="inter-token intervals observed (counter)")
    # the node's KV tiers (a reference engine whose class asks for them; else 0)
    kv_tier_offloaded: NonNegative = Field(default=0, description="evicted blocks the node's tier took (counter)")
    kv_tier_offload_dropped: NonNegative = Field(default=0, description="evicted blocks not offloaded: the queue "
                                                 "was full or the send failed (counter)")

    @model_validator(mode="before")
    @classmethod
    def _bounded_extras(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        extras = [key for key in data if key not in cls.model_fields]
        for key in extras:
            if not isinstance(key, str) or len(key) > METRIC_NAME_MAX or not METRIC_NAME.match(key):
                raise ValueError(f"metric name {str(key)[:METRIC_NAME_MAX]!r}: must be 1-{METRIC_NAME_MAX} letters, "
                                 "digits, '_', ':' or '.', not starting with a digit")
        if len(extras) > MAX_EXTRA_METRICS:
            raise ValueError(f"at most {MAX_EXTRA_METRICS} extra metrics, got {len(extras)}")
        return data


class EngineObserved(BaseModel):
    """One engine as it runs on a node."""

    model_config = ConfigDict(extra="ignore")

    name: EngineName
    model: ModelName
    class_ref: ClassRef
    role: Role
    state: EngineState
    pid: Pid | None = None
    port: Port | None = None
    url: Endpoint | None = None
    kv_events_endpoint: Endpoint | None = None
    restarts: Count32 = Field(default=0, description="times the agent restarted this engine")
    last_exit: ExitText | None = Field(default=None, description="how the last process ended, e.g. 'signal SIGKILL', 'exit 1'")
    metrics: EngineMetrics = Field(default_factory=EngineMetrics, description="zeros until the first scrape")
    launched: LaunchedCommand | None = Field(
        default=None, description="the command line and environment the agent launched it with; None: unknown")
    reported: ReportedConfig | None = Field(
        default=None, description="the engine's own account of its settings; None until it is ready and asked")
