"""The agent's one settings object, built once per process from `fleetctl agent serve` flags (and env).

Durations are in seconds and positive; memory in MiB. The break-glass `admin_token` and the controller
`token` are left out of the repr, so logging the settings never leaks them.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from pydantic import ConfigDict, Field

from agent.backoff import CONTROLLER_BACKOFF, RESTART_BACKOFF, Backoff
from engine.hashing import default_seed
from engine.process_settings import ProcessSettings


class AgentSettings(ProcessSettings):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    controller_url: str = Field(description="the controller's base URL, e.g. http://127.0.0.1:8080")
    node: str = Field(min_length=1, description="this node's name, unique in the fleet (lowercase letters, digits, '-')")
    token: str | None = Field(default=None, repr=False, description="bearer token for /api/v1/agents/*")
    state_dir: Path = Field(description="directory of engine logs, engine records (a cache for re-adoption) and the admin token")
    host: str = Field(default="127.0.0.1", description="address the agent's local API and its engines listen on")
    advertise_host: str | None = Field(default=None, description="host in the URLs the agent reports; default `host`")
    port: int = Field(default=8090, gt=0, le=65535, description="TCP port of the local API")
    port_range: tuple[int, int] = Field(default=(8100, 8999), description="engine ports are taken from here, LOW-HIGH inclusive, 3 per engine")
    labels: dict[str, str] = Field(default_factory=dict, description="node labels KEY=VALUE sent at registration")
    max_engines: int = Field(default=8, gt=0, description="capacity reported at registration: engines this node may run")
    kv_mib: int = Field(default=4096, gt=0, description="capacity reported at registration: MiB of KV memory")
    admin_token: str = Field(
        default_factory=lambda: secrets.token_urlsafe(24), repr=False,
        description="bearer token of the break-glass API (built without one: a random token)")
    kv_tier_token: str = Field(
        default_factory=lambda: secrets.token_urlsafe(24), repr=False,
        description="bearer token the node's engines offload to and fetch from its KV tiers with (given to them "
        "in env FLEET_KV_TIER_TOKEN); default a random one per agent start")
    admin_token_file: Path | None = Field(
        default=None, description="the file `admin_token` came from; a rotation writes the new one there")
    hash_seed: str = Field(
        default_factory=default_seed,
        description="prefix-hash (NONE_HASH) seed given to engines; default env FLEET_HASH_SEED or vLLM's default, "
        "vllm-none-hash")
    python: str = Field(default=sys.executable, description="interpreter that runs the reference engine")
    vllm_executable: str = Field(default="vllm", description="the `vllm` command for vLLM-backed classes")
    tick_s: float = Field(default=1.0, gt=0, description="seconds between supervisor passes (probe, plan, act)")
    startup_timeout_s: float = Field(default=600.0, gt=0, description="seconds an engine may take to become healthy before it is killed and restarted")
    unhealthy_after: int = Field(default=10, gt=0, description="consecutive failed health probes of a ready engine before it is killed")
    stop_timeout_s: float = Field(default=40.0, gt=0, description="seconds from SIGTERM to SIGKILL; covers the engine's own drain grace (30 s)")
    drain_timeout_s: float = Field(default=60.0, gt=0, description="seconds a draining engine may stay up before it gets SIGTERM")
    stable_after_s: float = Field(default=60.0, gt=0, description="seconds ready after which a crash no longer counts toward backoff")
    controller_backoff: Backoff = Field(default=CONTROLLER_BACKOFF, description="controller reconnect delays, seconds (full jitter)")
    restart_backoff: Backoff = Field(default=RESTART_BACKOFF, description="crash-restart delays, seconds (full jitter)")
    request_timeout_s: float = Field(default=5.0, gt=0, description="seconds one controller request may take")
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
    def direct_dir(self) -> Path:
        """the direct-action journal (engine.contract.direct)"""
        return self.state_dir / "direct"

    @property
    def records_dir(self) -> Path:
        return self.state_dir / "engines"

    @property
    def kv_tier_dir(self) -> Path:
        """the disk tiers of classes that name no disk_path, one directory per class"""
        return self.state_dir / "kv-tier"

    @property
    def local_api_url(self) -> str:
        """the agent's API as the node's own engines reach it"""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"
