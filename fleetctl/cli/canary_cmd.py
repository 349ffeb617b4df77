"""`fleetctl canary ...`: the app is canary_app.app; each module imported here adds its commands to it."""

from __future__ import annotations

from fleetctl.cli import canary_record  # noqa: F401  (record, references, golden check)
from fleetctl.cli import canary_status  # noqa: F401  (status, show, events)
from fleetctl.cli import canary_switch  # noqa: F401  (probes on|off)
from fleetctl.cli.canary_app import app

NAME = "canary"

__all__ = ["NAME", "app"]
