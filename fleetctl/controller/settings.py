"""The controller's one settings object, built once per process from the environment (and CLI flags).

Each field's description gives its unit, and what a None or computed default means; `fleetctl controller
serve` builds its options from these fields (tests/test_settings_options.py keeps the two in step).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleetctl.controller.paths import default_state_dir, sqlite_url

MIB = 1024 * 1024

# settings field -> environment variable
ENV_VARS = {
    "db_url": "FLEET_DB_URL",
    "state_dir": "FLEET_STATE_DIR",
    "host": "FLEET_HOST",
    "port": "FLEET_PORT",
    "heartbeat_interval_s": "FLEET_HEARTBEAT_INTERVAL_S",
    "down_after_s": "FLEET_DOWN_AFTER_S",
    "reconcile_interval_s": "FLEET_RECONCILE_INTERVAL_S",
    "heartbeat_flush_s": "FLEET_HEARTBEAT_FLUSH_S",
    "bootstrap_token": "FLEET_BOOTSTRAP_TOKEN",
    "canary_probe_api_key": "FLEET_CANARY_PROBE_API_KEY",
}
# Every canary setting may come from the environment too (FLEET_CANARY_PRODUCTION_INTERVAL_S, ...): `fleetctl up`
# passes its environment on to the controller, which is how the demo compresses the probe intervals.
ENV_VARS.update({name: f"FLEET_{name.upper()}" for name in (
    "canary_budget_share", "canary_capacity_window_s", "canary_pinned_interval_s", "canary_production_interval_s",
    "canary_floor_interval_s", "canary_urgent_interval_s", "canary_production_share",
    "canary_urgent_share", "canary_false_alarm_days",
    "canary_shift", "canary_min_probes",
    "canary_recovery_probes", "canary_timeout_s", "canary_concurrency", "canary_webhook_url", "canary_batch_conditions")})
ENV_VARS.update({name: f"FLEET_{name.upper()}" for name in (
    "watch_tick_s", "watch_ping_s", "watch_history_mib", "watch_events", "replica_name")})


class ControllerSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    state_dir: Path = Field(
        default_factory=default_state_dir,
        description="directory for the SQLite file and the bootstrap token file; "
        "default $FLEET_STATE_DIR or ~/.local/state/fleetctl",
    )
    db_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db; default SQLite (WAL) "
        "at STATE_DIR/fleet.db",
    )
    host: str = Field(default="127.0.0.1", description="address the API listens on")
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port the API listens on (0: any free port)")
    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="seconds between agent heartbeats, told to agents")
    down_after_s: float | None = Field(
        default=None, gt=0, description="seconds without a heartbeat before a node is marked down; default 3 x heartbeat_interval_s"
    )
    reconcile_interval_s: float = Field(default=2.0, gt=0, description="seconds between background reconcile passes (leader only)")
    heartbeat_flush_s: float = Field(
        default=0.25, ge=0, description="seconds between batched writes of accepted heartbeats "
        "(controller/heartbeats.py); 0: write each beat in its own transaction"
    )
    token_cache_s: float = Field(
        default=5.0, ge=0, description="seconds a verified token is remembered (a revocation made through another "
        "controller replica takes effect here within this); 0: look every token up"
    )
    bootstrap_token: str | None = Field(
        default=None, min_length=16, description="an admin token accepted in addition to stored ones (never stored); default none"
    )
    max_body_bytes: int = Field(default=MIB, gt=0, description="largest request body in bytes; larger is a 413")
    migrate_on_start: bool = Field(default=True, description="apply Alembic migrations when the controller starts")
    background: bool = Field(default=True, description="run the leader election + reconcile loop in a background thread")
    # --- the quality canary (fleetctl/canary, docs/canary.md) ---
    canary_budget_share: float = Field(
        default=0.02, gt=0, le=1, description="probes may cost at most this share of the fleet's busy capacity "
        "(its peak served tokens/s over canary_capacity_window_s)")
    canary_capacity_window_s: float = Field(
        default=3600.0, gt=0, description="trailing window over which the fleet's busy capacity is measured")
    canary_pinned_interval_s: float = Field(
        default=60.0, gt=0, description="seconds between pinned probes of one stream (class revision x batch "
        "condition) while the budget allows")
    canary_production_interval_s: float = Field(
        default=5.0, gt=0, description="seconds between production-path probes of one model while the budget allows")
    canary_floor_interval_s: float = Field(
        default=120.0, gt=0, description="the floor rate, paid for first from the budget and spent "
        "even when the budget cannot pay for it: every live revision gets a pinned probe (its batch conditions in "
        "turn) and every model a production probe at least this often")
    canary_urgent_interval_s: float = Field(
        default=15.0, gt=0, description="seconds between pinned probes of an urgent stream: one warming up (fewer "
        "than canary_min_probes scored probes: a new revision) or suspect (bad probes not yet explained away, or "
        "an alarm in force; pinned to the engine that served the latest bad one); funded first, up to "
        "canary_urgent_share of what the floor leaves, then from what the production streams leave, before the "
        "other pinned streams")
    canary_production_share: float = Field(
        default=0.8, ge=0, le=1, description="the production streams' least share of the budget the floor leaves "
        "when the pinned streams want more of it too, after the urgent streams' first claim (they get all they "
        "want when the others leave room)")
    canary_urgent_share: float = Field(
        default=0.5, ge=0, le=1, description="the urgent streams' first claim on the budget the floor leaves, "
        "before the production streams: a revision that serves users unmeasured (warming) or a stream with bad "
        "probes not yet explained away (suspect) is where the evidence is; a healthy fleet has none, so the "
        "production streams then get their full share")
    canary_false_alarm_days: float = Field(
        default=30.0, gt=0, description="target mean time between false alarms of one stream, probing at its "
        "configured interval; the tests' thresholds follow from it")
    canary_shift: float = Field(
        default=0.15, gt=0, lt=1, description="the shift the tests are tuned to detect: this fraction of a stream's "
        "probes turning bad (0.15: a misroute of 15 requests in 100)")
    canary_min_probes: int = Field(
        default=10, ge=1, description="scored probes a stream needs before its verdict is anything but not_measured")
    canary_recovery_probes: int = Field(
        default=20, ge=1, description="consecutive good probes after an alarm before a stream is healthy again")
    canary_batch_conditions: str = Field(
        default="1,4,8,16", pattern=r"^[1-9][0-9]{0,3}(,[1-9][0-9]{0,3}){0,7}$",
        description="the batch conditions pinned probes run at (condition - 1 concurrent fillers each), comma-separated")
    canary_timeout_s: float = Field(default=60.0, gt=0, description="seconds one probe (with its fillers) may take")
    canary_concurrency: int = Field(default=2, ge=1, description="probes in flight at once, fleet-wide")
    canary_budget_window_s: float = Field(
        default=300.0, gt=0, description="trailing window over which the probes' token rate (the probe share) "
        "is measured")
    canary_probe_retention_s: float = Field(
        default=7 * 86400.0, gt=0, description="seconds a stored probe is kept; older ones are deleted")
    canary_probe_api_key: str | None = Field(
        default=None, repr=False, description="API key the controller's probes send to gateways that require "
        "one (Authorization: Bearer); give it no rate limit. Default none (open gateways)")
    canary_webhook_url: str | None = Field(
        default=None, description="POST each canary alert and recovery here as JSON; default none")
    # --- the change stream, GET /api/v1/watch (fleetctl/controller/watch_hub.py, docs/control-plane.md) ---
    watch_tick_s: float = Field(
        default=1.0, gt=0, le=60, description="seconds between two readings of the fleet while a viewer is connected; "
        "what changed between them is one delta")
    watch_ping_s: float = Field(
        default=2.0, gt=0, le=300, description="seconds of silence after which a viewer gets a ping (clients treat "
        "about 3 of these without one as a broken stream)")
    watch_history_mib: float = Field(
        default=32.0, gt=0, description="MiB of serialised deltas kept for viewers that resume or fall behind; "
        "the oldest are dropped first (such a viewer gets a snapshot)")
    watch_events: int = Field(default=200, ge=0, le=10_000, description="events (audit, canary, rollout) a snapshot carries")
    replica_name: str | None = Field(
        default=None, max_length=200, description="this controller replica's name in the change stream; default HOST:PORT")

    @property
    def batch_conditions(self) -> tuple[int, ...]:
        return tuple(sorted({int(c) for c in self.canary_batch_conditions.split(",")}))

    @property
    def database_url(self) -> str:
        return self.db_url or sqlite_url(self.state_dir)

    @property
    def down_after(self) -> float:
        return self.down_after_s or 3 * self.heartbeat_interval_s

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @classmethod
    def from_env(cls, **overrides: Any) -> "ControllerSettings":
        """Environment first, then `overrides` (None values are ignored, so CLI flags can pass through)."""
        values: dict[str, Any] = {field: os.environ[var] for field, var in ENV_VARS.items() if os.environ.get(var)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
