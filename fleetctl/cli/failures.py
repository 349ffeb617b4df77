"""The one place that turns exceptions into an exit code and one readable stderr line (no tracebacks).

The root command group (`FleetGroup`) wraps every command's invocation, so this applies to all commands
of all modules, under CliRunner as well as from a shell. Set FLEET_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import os
from typing import Any

import typer
import yaml
from typer.core import TyperGroup

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.errors import AuthError, Conflict, FleetError, NotFound, Unavailable, ValidationFailed

# 409s that a retry after a fresh read resolves (a concurrent writer won), as opposed to a refusal by state
RETRYABLE_CONFLICTS = frozenset({"concurrent_change", "version_conflict", "conflict"})

_CODES: list[tuple[type[FleetError], ExitCode]] = [
    (NotFound, ExitCode.NOT_FOUND),
    (AuthError, ExitCode.AUTH),
    (Conflict, ExitCode.REFUSED),
    (ValidationFailed, ExitCode.USAGE),
    (Unavailable, ExitCode.UNAVAILABLE),
]


def describe(exc: BaseException) -> tuple[ExitCode, str]:
    """(exit code, one line) for any exception a command may raise."""
    if isinstance(exc, FleetError):
        return _fleet_code(exc), _fleet_message(exc)
    if isinstance(exc, yaml.YAMLError):
        return ExitCode.USAGE, f"invalid YAML: {' '.join(str(exc).split())}"
    if isinstance(exc, OSError):
        return ExitCode.USAGE, f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
    return ExitCode.ERROR, f"unexpected {type(exc).__name__}: {exc}"


def _fleet_code(exc: FleetError) -> ExitCode:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return ExitCode.REFUSED if 400 <= exc.status < 500 else ExitCode.ERROR


def _fleet_message(exc: FleetError) -> str:
    message = " ".join(exc.message.split())  # one line, whatever the server sent
    if isinstance(exc, AuthError) and exc.status == 401:
        message += (" (the node's break-glass credential file: --admin-token-file, or credential_file in the "
                    "--direct inventory)" if exc.code == "bad_credential" else " (pass --token or set FLEET_TOKEN)")
    if exc.code in RETRYABLE_CONFLICTS and "retry" not in message:
        message += " (changed concurrently: re-read and retry)"
    return message


class FleetGroup(TyperGroup):
    """The root group: maps errors escaping any command to exit codes."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception as exc:
            if os.environ.get("FLEET_DEBUG"):
                raise
            code, message = describe(exc)
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(int(code)) from None
