"""`fleetctl canary probes on|off`: the kill switch of the canary's probes (the `canary_probes` flag).

Off, the controller sends no probe until it is on again; the verdicts stay as they were and age (a stream
that stops being probed keeps its last verdict and the time since). The flag is served to gateways with
the routing table like every flag, and audited like every change.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from fleetctl.canary.types import PROBES_FLAG
from fleetctl.cli.canary_app import app
from fleetctl.cli.context import ReasonOption, client
from fleetctl.cli.output import status


class Switch(str, Enum):
    on = "on"
    off = "off"


@app.command("probes")
def probes_cmd(ctx: typer.Context, switch: Annotated[Switch, typer.Argument(help="on or off")],
               reason: ReasonOption = None) -> None:
    """Turn the canary's probes on or off (the canary_probes flag)."""
    result = client(ctx).set_flag(PROBES_FLAG, switch is Switch.on, reason=reason)
    changed = "" if result.result == "changed" else " (already)"
    status(f"canary probes {switch.value}{changed}")
