"""`fleetctl token create|list|revoke` (admin)."""

from __future__ import annotations

from typing import Annotated

import typer

from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.output import Format, OutputOption, col, emit, status

NAME = "token"
app = typer.Typer(no_args_is_help=True, help="API tokens (admin): create, list, revoke.")

COLUMNS = [col("TOKEN", "name"), col("ROLE", "role"), col("CREATED", "created_at"), col("BY", "created_by"),
           col("REVOKED", "revoked_at")]
TokenArg = Annotated[str, typer.Argument(help="token name")]


@app.command()
def create(ctx: typer.Context, name: TokenArg,
           role: Annotated[str, typer.Option("--role", help="viewer, operator, admin or agent")],
           reason: ReasonOption = None, output: OutputOption = Format.table) -> None:
    """Create a token; it is printed once (stdout) and only its sha256 is kept."""
    created = client(ctx).create_token(name, role, reason)
    status(f"token {name} ({created.role}) created; store it now, it is not shown again")
    if output is Format.table:
        typer.echo(created.token)
    else:
        emit(created, output)


@app.command("list")
def list_tokens(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """All tokens (names and roles, never the tokens)."""
    emit(client(ctx).list_tokens(), output, COLUMNS)


@app.command()
def revoke(ctx: typer.Context, name: TokenArg, reason: ReasonOption = None, yes: YesOption = False,
           force: Annotated[bool, typer.Option("--force", help="revoke even the last active admin token, or the token "
                                                "this command uses (refused otherwise; audited either way)")] = False) -> None:
    """Revoke a token at once (the name stays in the list)."""
    confirm(f"Revoke token {name}?", yes)
    result = client(ctx).revoke_token(name, reason, force=force)
    status(f"token {name}: " + ("revoked" if result.result == "revoked" else "already revoked"))
    if result.overridden:
        status(f"warning: forced past {', '.join(result.overridden)}")
