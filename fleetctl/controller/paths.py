"""Where local state lives. Light on purpose: the CLI imports it to find the bootstrap token."""

from __future__ import annotations

import os
from pathlib import Path

BOOTSTRAP_TOKEN_FILE = "bootstrap-token"
SQLITE_FILE = "fleet.db"


def default_state_dir() -> Path:
    """FLEET_STATE_DIR, else $XDG_STATE_HOME/fleetctl, else ~/.local/state/fleetctl."""
    if os.environ.get("FLEET_STATE_DIR"):
        return Path(os.environ["FLEET_STATE_DIR"]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "fleetctl"


def bootstrap_token_path(state_dir: Path) -> Path:
    return state_dir / BOOTSTRAP_TOKEN_FILE


def sqlite_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / SQLITE_FILE}"
