"""The gateway's one settings object, built once per process (from `fleetctl gateway serve` flags).

Where the routing table comes from is either the controller (`controller_url`, refreshed and cached) or a
static list of engines (`static_engines`, each entry `URL[?role=prefill|decode|mixed&kv_events=tcp://H:P]`),
whose models and context windows are discovered from the engines' own /v1/models and /metrics.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.hashing import default_seed


@dataclass(frozen=True)
class GatewaySettings:
    # --- listening ---
    host: str = "127.0.0.1"
    port: int = 8000
    gateway_name: str | None = None  # how the controller lists this gateway (a DNS label); default <host>-<port>
    advertise_url: str | None = None  # the URL reported to the controller; default http://<host>:<port>
    # --- where the routing table comes from (exactly one) ---
    controller_url: str | None = None  # the controller's base URL; GET /api/v1/routing with a viewer token
    controller_token: str | None = field(default=None, repr=False)  # never logged
    static_engines: tuple[str, ...] = ()  # `URL[?role=...&kv_events=...]` entries (no controller)
    static_flags: dict[str, Any] = field(default_factory=dict)  # the table's flags in static mode
    table_refresh_s: float = 2.0  # seconds between routing-table refreshes (static: re-discovery)
    # --- clients ---
    api_keys_file: Path | None = None  # lines `name:key:rps`; none configured: the gateway is open
    api_keys_env: str | None = field(default=None, repr=False)  # same lines, comma or newline separated
    # --- engines: probes and timeouts (seconds) ---
    engine_api_key: str | None = field(default=None, repr=False)  # sent to engines started with --api-key
    probe_interval_s: float = 1.0  # GET /health and /metrics of every engine
    probe_timeout_s: float = 1.0
    connect_timeout_s: float = 2.0  # TCP connect to an engine
    first_token_timeout_s: float = 60.0  # request sent -> first generated token (or the whole non-streamed answer start)
    idle_timeout_s: float = 60.0  # between two stream chunks (engine keep-alives count)
    request_timeout_s: float = 600.0  # a whole non-streamed answer
    keepalive_interval_s: float = 5.0  # SSE `: keep-alive` comment while a stream waits
    max_retries: int = 2  # further engines tried after a failure before the first token
    # --- routing ---
    hash_seed: str = field(default_factory=default_seed)  # NONE_HASH seed: must match the engines
    share_half_life_requests: float = 32.0  # recent traffic shares halve every this many routed requests (hot-spot guard)
    locality_weight: float = 2.0  # scorer.ScorerPolicy.locality_weight
    hot_spot_factor: float = 1.5  # scorer.ScorerPolicy.hot_spot_factor
    max_sessions: int = 100_000  # x-session-id -> engine entries kept (LRU)
    # --- admission ---
    admission: bool = True
    ttft_slo_s: float = 30.0  # predicted time to first token above this is refused with 429
    max_decode_slots: int | None = None  # concurrent decodes per engine; None: the class's max_num_seqs
    default_prefill_tokens_per_s: float = 2000.0  # until an engine's metrics give an estimate
    default_decode_step_s: float = 0.02  # until an engine's metrics give an estimate

    @property
    def name(self) -> str:
        return self.gateway_name or default_gateway_name(self.port)

    @property
    def url(self) -> str:
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        return self.advertise_url or f"http://{host}:{self.port}"

    def __post_init__(self) -> None:
        if bool(self.controller_url) == bool(self.static_engines):
            raise ValueError("give either a controller URL or a static engine list, not both or neither")
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.locality_weight < 0:
            raise ValueError("locality_weight must be >= 0")
        if self.share_half_life_requests <= 0:
            raise ValueError("share_half_life_requests must be positive")
        if self.hot_spot_factor < 1:
            raise ValueError("hot_spot_factor must be >= 1 (1: no engine may take more than the mean share with its cache)")
        for name in ("probe_interval_s", "probe_timeout_s", "connect_timeout_s", "first_token_timeout_s",
                     "idle_timeout_s", "request_timeout_s", "keepalive_interval_s", "ttft_slo_s", "table_refresh_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


def default_gateway_name(port: int) -> str:
    """`<hostname>-<port>` as a DNS label (lowercase letters, digits and dashes, at most 63)."""
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-") or "gateway"
    suffix = f"-{port}"
    return host[: 63 - len(suffix)].rstrip("-") + suffix
