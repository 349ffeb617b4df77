"""The gateway's one settings object, built once per process (from `fleetctl gateway serve` flags and env).

Where the routing table comes from is either the controller (`controller_url`, refreshed and cached) or a
static list of engines (`static_engines`, each entry `URL[?role=prefill|decode|mixed&kv_events=tcp://H:P]`),
whose models and context windows are discovered from the engines' own /v1/models and /metrics; exactly one
of the two is given. Every duration is in seconds and positive. Secrets (`controller_token`,
`api_keys_env`, `engine_api_key`) are left out of the repr, so logging the settings never leaks them.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from engine.hashing import default_seed
from engine.process_settings import ProcessSettings

API_KEYS_ENV = "FLEET_GATEWAY_API_KEYS"
ENGINE_API_KEY_ENV = "FLEET_ENGINE_API_KEY"


class GatewaySettings(ProcessSettings):
    # --- listening ---
    host: str = Field(default="127.0.0.1", description="address the gateway listens on")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port the gateway listens on")
    gateway_name: str | None = Field(
        default=None, description="how the controller lists this gateway (a DNS label); default HOSTNAME-PORT")
    advertise_url: str | None = Field(
        default=None, description="the URL reported to the controller; default http://HOST:PORT")
    # --- direct mode (break-glass without the controller) ---
    state_dir: Path | None = Field(
        default=None, description="directory of the direct-action journal and local flag overrides; none: "
        "direct mode is off")
    breakglass_token: str | None = Field(
        default=None, repr=False, description="this gateway's break-glass credential (direct mode)")
    breakglass_token_file: Path | None = Field(
        default=None, description="the file `breakglass_token` came from; a rotation writes the new one there")
    # --- where the routing table comes from (exactly one) ---
    controller_url: str | None = Field(
        default=None, description="the controller's base URL; the routing table is GET /api/v1/routing")
    controller_token: str | None = Field(
        default=None, repr=False, description="viewer token for the controller's routing table")
    static_engines: tuple[str, ...] = Field(
        default=(), description="static engines instead of a controller: URL[?role=prefill|decode|mixed&"
        "kv_events=tcp://H:P] entries")
    static_flags: dict[str, Any] = Field(
        default_factory=dict, description="static mode: the routing table's flags, e.g. pd_disaggregation:MODEL=false")
    table_refresh_s: float = Field(
        default=2.0, gt=0, description="seconds between routing-table refreshes (static mode: re-discovery)")
    # --- clients ---
    api_keys_file: Path | None = Field(
        default=None, description="client keys, one per line: name, key and requests per second, separated by "
        "':'; no keys at all: the gateway is open")
    api_keys_env: str | None = Field(
        default=None, repr=False, description=f"client keys as in api_keys_file, comma or newline separated "
        f"(env {API_KEYS_ENV})")
    # --- engines: probes and timeouts ---
    engine_api_key: str | None = Field(
        default=None, repr=False, description="key sent to engines started with --api-key")
    probe_interval_s: float = Field(default=1.0, gt=0, description="seconds between GET /health and /metrics probes of every engine")
    probe_timeout_s: float = Field(default=1.0, gt=0, description="seconds one engine probe may take")
    connect_timeout_s: float = Field(default=2.0, gt=0, description="seconds a TCP connect to an engine may take")
    first_token_timeout_s: float = Field(
        default=60.0, gt=0, description="seconds from request sent to the first generated token (or the start of "
        "a non-streamed answer)")
    idle_timeout_s: float = Field(
        default=60.0, gt=0, description="longest silence between two stream chunks, seconds (engine keep-alives count)")
    request_timeout_s: float = Field(default=600.0, gt=0, description="seconds a whole non-streamed answer may take")
    keepalive_interval_s: float = Field(
        default=5.0, gt=0, description="seconds between SSE `: keep-alive` comments while a stream waits")
    max_retries: int = Field(
        default=2, ge=0, description="further engines tried after a failure before the first token")
    # --- routing ---
    hash_seed: str = Field(
        default_factory=default_seed, description="prefix-hash (NONE_HASH) seed; must match the engines; "
        "default env FLEET_HASH_SEED or vLLM's default, vllm-none-hash")
    share_half_life_requests_per_engine: float = Field(
        default=32.0, gt=0, description="scorer's hot-spot guard: recent traffic shares halve every this many "
        "routed requests times the number of engines (fleetctl/gateway/traffic.py)")
    locality_weight: float = Field(
        default=2.0, ge=0, description="scorer: worth of a second of prefill a cached prefix saves, against a "
        "second of queue (fleetctl/gateway/scorer.py)")
    hot_spot_factor: float = Field(
        default=1.5, ge=1, description="scorer: an engine above this times the mean traffic share competes on "
        "load alone (1: no engine may take more than the mean share with its cache)")
    hot_spot_damping: float = Field(
        default=0.0, ge=0, le=1, description="scorer: what a hot spot's locality bonus is multiplied by (0: its "
        "cache is ignored; 0.5 with --locality-weight 2: the engine that would answer this request sooner wins)")
    engines_share_hardware: bool = Field(
        default=False, description="scorer: the engines run on the same cores or GPU (e.g. several reference "
        "engines on one CPU host), so spreading a hot prefix buys no parallelism: the hot-spot guard is off")
    shared_hardware_own_load: float = Field(
        default=0.5, ge=0, le=1, description="scorer, engines sharing hardware: weight of an engine's own load "
        "against the mean of the engines it shares with (0: their load is one pool, locality decides; 1: its own "
        "load only)")
    shared_prefix_requests: float = Field(
        default=0.0, ge=0, description="scorer: a prefix that p recent requests began with has its cache bonus "
        "multiplied by min(1, this / p), so a popular shared prefix spreads to less loaded engines (0: off)")
    running_cost_steps: float = Field(
        default=0.0, ge=0, description="scorer: a running decode costs a new request this many of the engine "
        "class's measured decode steps (0: a fixed 5 ms)")
    warm_prefix_requests: float = Field(
        default=8.0, ge=0, description="engines with hardware of their own: a prompt prefix at least this many "
        "recent requests began with is prefilled ahead on an idle engine that lacks it, so load can spread "
        "without a cold prefill (0: off; off with --engines-share-hardware)")
    warm_min_blocks: int = Field(
        default=4, ge=1, description="the shortest popular prefix, in KV blocks, worth warming on an idle engine")
    max_sessions: int = Field(default=100_000, gt=0, description="x-session-id -> engine entries kept (LRU)")
    # --- admission ---
    admission: bool = Field(default=True, description="refuse requests predicted to break the SLO (429)")
    ttft_slo_s: float = Field(
        default=30.0, gt=0, description="admission: seconds of predicted time to first token above which a "
        "request is refused")
    max_decode_slots: int | None = Field(
        default=None, gt=0, description="admission: concurrent decodes per engine; default the class's max_num_seqs")
    default_prefill_tokens_per_s: float = Field(
        default=2000.0, gt=0, description="admission: prefill tokens per second assumed until an engine's metrics "
        "give an estimate")
    default_decode_step_s: float = Field(
        default=0.02, gt=0, description="admission: seconds per decode step assumed until an engine's metrics "
        "give an estimate")

    @model_validator(mode="after")
    def _one_table_source(self) -> GatewaySettings:
        if bool(self.controller_url) == bool(self.static_engines):
            raise ValueError("give either a controller URL or a static engine list, not both or neither")
        return self

    @property
    def name(self) -> str:
        return self.gateway_name or default_gateway_name(self.port)

    @property
    def url(self) -> str:
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        return self.advertise_url or f"http://{host}:{self.port}"


def default_gateway_name(port: int) -> str:
    """`<hostname>-<port>` as a DNS label (lowercase letters, digits and dashes, at most 63)."""
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-") or "gateway"
    suffix = f"-{port}"
    return host[: 63 - len(suffix)].rstrip("-") + suffix
