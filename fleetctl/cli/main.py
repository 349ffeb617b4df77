"""The root of the `fleetctl` command line: global options and the registry of command modules.

Each module in COMMAND_MODULES exposes `app: typer.Typer` and `NAME` (its noun) and is mounted as
`fleetctl NAME ...`. To add one, write the module and register it with ONE line in COMMAND_MODULES
(plus its import), e.g.
    from fleetctl.cli import traffic_cmd      # and list traffic_cmd in COMMAND_MODULES
A module with NAME = None has its commands merged into the root (`fleetctl up`, `fleetctl down`); a single
top-level command with options of its own can also be a Typer with `invoke_without_command=True` and an
`@app.callback()` (see status_cmd.py).

Errors from any command become an exit code and one line on stderr (failures.py; codes in exit_codes.py).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from fleetctl.cli import (
    agent_cmd,
    audit_cmd,
    breakglass_cmd,
    canary_cmd,
    class_cmd,
    controller_cmd,
    deploy_cmd,
    drill_cmd,
    engine_cmd,
    flag_cmd,
    gateway_cmd,
    kv_cmd,
    node_cmd,
    pd_cmd,
    rollout_cmd,
    runbook_cmd,
    status_cmd,
    token_cmd,
    traffic_cmd,
    tui_cmd,
    up_cmd,
)
from fleetctl.cli.context import CliContext
from fleetctl.cli.failures import FleetGroup
from fleetctl.client import DEFAULT_CONTROLLER, DEFAULT_TIMEOUT_S

COMMAND_MODULES: list[ModuleType] = [
    status_cmd,
    node_cmd,
    kv_cmd,  # kv status|flush
    engine_cmd,
    class_cmd,
    deploy_cmd,
    audit_cmd,
    token_cmd,
    controller_cmd,
    agent_cmd,  # agent serve|engines|drain|restart|stop; engine serve
    up_cmd,  # up, down (NAME None: merged at the top level)
    gateway_cmd,  # gateway serve; route explain (NAME None: merged at the top level)
    traffic_cmd,  # traffic get|set
    flag_cmd,  # flag list|get|set|unset
    breakglass_cmd,  # breakglass freeze|unfreeze|pin|unpin|shed|kill-switch|status
    rollout_cmd,  # rollout start|list|status|watch|pause|resume|promote|abort|retry|undo|history
    canary_cmd,  # canary record|status|show|events
    drill_cmd,  # drill misroute|plant|stop|list
    pd_cmd,  # pd status|plan|rebalance|stop|show|list|mode|profile
    runbook_cmd,  # runbook list|show|validate|run
    tui_cmd,  # tui: the live fleet view (imports ui inside the command)
]

app = typer.Typer(
    cls=FleetGroup,
    name="fleetctl",
    no_args_is_help=True,
    help="Operator console for an LLM inference fleet: fleetctl NOUN VERB.",
    pretty_exceptions_enable=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    controller: Annotated[str, typer.Option("--controller", envvar="FLEET_CONTROLLER", help="controller URL")] = DEFAULT_CONTROLLER,
    token: Annotated[str | None, typer.Option(
        "--token", envvar="FLEET_TOKEN", show_default=False,
        help="API token [default: the local bootstrap token in $FLEET_STATE_DIR or ~/.local/state/fleetctl]",
    )] = None,
    request_timeout: Annotated[float, typer.Option("--request-timeout", help="seconds per API request")] = DEFAULT_TIMEOUT_S,
    direct: Annotated[str | None, typer.Option(
        "--direct", envvar="FLEET_DIRECT", metavar="all|NAME,...|URL,...", show_default=False,
        help="break-glass: talk to these agents and gateways on their own credentials, without the controller "
             "(status, engine list|drain|stop|restart, flag set|unset, breakglass pin|unpin|shed|kill-switch)",
    )] = None,
    inventory: Annotated[Path | None, typer.Option(
        "--inventory", envvar="FLEET_INVENTORY", show_default=False,
        help="the direct-mode inventory [default: inventory.yaml in $FLEET_STATE_DIR or ~/.local/state/fleetctl]",
    )] = None,
) -> None:
    ctx.obj = CliContext(controller, token, request_timeout, direct, inventory)
    ctx.call_on_close(ctx.obj.close)


for module in COMMAND_MODULES:
    app.add_typer(module.app, name=module.NAME)


def main() -> None:
    app(prog_name="fleetctl")


if __name__ == "__main__":
    main()
