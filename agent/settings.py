"""The agent's one settings object, built once per process from `fleetctl agent serve` flags (and env)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agent.backoff import CONTROLLER_BACKOFF, RESTART_BACKOFF, Backoff
from engine.hashing import default_seed


class AgentSettings(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    controller_url: str = Field(description="the controller's base URL, e.g. http://127.0.0.1:8080")
    node: str = Field(min_length=1, description="this node's name, unique in the fleet")
    token: str | None = Field(default=None, description="bearer token for /api/v1/agents/*; default none")
    state_dir: Path = Field(description="engine logs, engine records (a cache for re-adoption), the admin token")
    host: str = Field(default="127.0.0.1", description="address the agent's local API and its engines listen on")
    advertise_host: str | None = Field(default=None, description="host in the URLs the agent reports; default `host` (loopback)")
    port: int = Field(default=8090, gt=0, le=65535, description="TCP port of the local API")
    port_range: tuple[int, int] = Field(default=(8100, 8999), description="engine ports are taken from here, inclusive")
    labels: dict[str, str] = Field(default_factory=dict, description="node labels sent at registration")
    max_engines: int = Field(default=8, gt=0, description="capacity reported at registration: engines")
    kv_mib: int = Field(default=4096, gt=0, description="capacity reported at registration: MiB of KV memory")
    admin_token: str = Field(default_factory=lambda: secrets.token_urlsafe(24), description="bearer token of the break-glass API")
    hash_seed: str = Field(default_factory=default_seed, description="NONE_HASH seed given to engines (FLEET_HASH_SEED)")
    python: str = Field(default=sys.executable, description="interpreter that runs the reference engine")
    vllm_executable: str = Field(default="vllm", description="the `vllm` command for vLLM-backed classes")
    tick_s: float = Field(default=1.0, gt=0, description="seconds between supervisor passes (probe, plan, act)")
    startup_timeout_s: float = Field(default=600.0, gt=0, description="an engine not healthy after this long is killed and restarted")
    unhealthy_after: int = Field(default=10, gt=0, description="consecutive failed health probes of a ready engine before it is killed")
    stop_timeout_s: float = Field(default=40.0, gt=0, description="SIGTERM to SIGKILL; covers the engine's own drain grace (30 s)")
    drain_timeout_s: float = Field(default=60.0, gt=0, description="a draining engine still up after this long gets SIGTERM")
    stable_after_s: float = Field(default=60.0, gt=0, description="ready this long and a crash no longer counts toward backoff")
    controller_backoff: Backoff = Field(default=CONTROLLER_BACKOFF, description="reconnect delays (full jitter)")
    restart_backoff: Backoff = Field(default=RESTART_BACKOFF, description="crash-restart delays (full jitter)")
    request_timeout_s: float = Field(default=5.0, gt=0, description="timeout of one controller request")
    keep_engines_on_exit: bool = Field(default=False, description="on SIGTERM, leave engines running for the next agent to re-adopt")

    @property
    def url_host(self) -> str:
        return self.advertise_host or self.host

    @property
    def api_url(self) -> str:
        return f"http://{self.url_host}:{self.port}"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def records_dir(self) -> Path:
        return self.state_dir / "engines"
