"""Global options (--controller, --token) and what commands share: the client, reasons, confirmations."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer

from fleetctl.client import DEFAULT_CONTROLLER, DEFAULT_TIMEOUT_S, ControllerClient
from fleetctl.controller.paths import bootstrap_token_path, default_state_dir

if TYPE_CHECKING:
    from fleetctl.cli.direct_mode import DirectFleet

ReasonOption = Annotated[str | None, typer.Option("--reason", help="why (recorded in the audit log)")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]


@dataclass
class CliContext:
    controller: str = DEFAULT_CONTROLLER
    token: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    direct: str | None = None  # --direct TARGETS: talk to agents and gateways, not the controller
    inventory: Path | None = None
    _client: ControllerClient | None = field(default=None, repr=False)

    def direct_fleet(self) -> "DirectFleet | None":
        """The targets of --direct (None without it)."""
        if self.direct is None:
            return None
        from fleetctl.cli.direct_mode import DirectFleet, default_inventory, resolve_targets

        return DirectFleet(resolve_targets(self.direct, self.inventory or default_inventory()), self.timeout_s)

    def client(self) -> ControllerClient:
        if self.direct is not None:
            from fleetctl.cli.direct_mode import needs_controller

            current = click.get_current_context(silent=True)
            raise needs_controller(current.command_path.removeprefix("fleetctl ") if current else "this command")
        if self._client is None:
            self._client = ControllerClient(self.controller, self.token or local_token(), self.timeout_s)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def local_token() -> str | None:
    """The bootstrap token the local controller wrote (FLEET_STATE_DIR or ~/.local/state/fleetctl)."""
    path: Path = bootstrap_token_path(default_state_dir())
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def cli(ctx: typer.Context) -> CliContext:
    obj = ctx.find_object(CliContext)
    if obj is None:  # a module's app invoked on its own (tests): defaults and environment
        obj = CliContext(os.environ.get("FLEET_CONTROLLER", DEFAULT_CONTROLLER), os.environ.get("FLEET_TOKEN"))
        ctx.obj = obj
    return obj


def client(ctx: typer.Context) -> ControllerClient:
    return cli(ctx).client()


def direct(ctx: typer.Context) -> "DirectFleet | None":
    """The --direct targets, or None when the command goes through the controller."""
    return cli(ctx).direct_fleet()


def confirm(prompt: str, yes: bool) -> None:
    """Ask before a destructive command unless --yes; 'no' aborts (exit 1)."""
    if not yes:
        typer.confirm(prompt, abort=True)
