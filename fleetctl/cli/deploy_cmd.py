"""`fleetctl deploy set|list|delete`."""

from __future__ import annotations

from typing import Annotated

import typer

from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.output import Format, OutputOption, col, emit, status
from fleetctl.errors import ValidationFailed

NAME = "deploy"
app = typer.Typer(no_args_is_help=True, help="Deployments: set, list, delete.")

COLUMNS = [col("DEPLOYMENT", "name"), col("MODEL", "model"), col("CLASS", "class_ref"), col("ROLE", "role"),
           col("REPLICAS", "replicas"), col("PLACEMENT", "placement")]
DeploymentArg = Annotated[str, typer.Argument(help="deployment name")]


def parse_labels(labels: list[str]) -> dict[str, str]:
    parsed = {}
    for label in labels:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise ValidationFailed(f"--label {label!r}: expected KEY=VALUE", field="placement")
        parsed[key] = value
    return parsed


@app.command("set")
def set_deployment(
    ctx: typer.Context,
    name: DeploymentArg,
    class_ref: Annotated[str, typer.Option("--class", help="class revision NAME@rN (or NAME: its latest)")],
    replicas: Annotated[int, typer.Option("--replicas", help="engines wanted (>= 0)")],
    role: Annotated[str, typer.Option("--role", help="mixed, prefill or decode")] = "mixed",
    label: Annotated[list[str] | None, typer.Option("--label", help="placement: node label KEY=VALUE (repeatable)")] = None,
    model: Annotated[str | None, typer.Option("--model", help="model name (default: the class's)")] = None,
    reason: ReasonOption = None,
    output: OutputOption = Format.table,
    yes: YesOption = False,  # it can scale engines away, so it takes --yes like the others; it asks nothing
) -> None:
    """Create or update deployment NAME."""
    result = client(ctx).set_deployment(name, class_ref, replicas, role, parse_labels(label or []), model, reason)
    status(f"deployment {name}: {result.result}")
    emit(result, output, COLUMNS)


@app.command("list")
def list_deployments(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """All deployments."""
    emit(client(ctx).list_deployments(), output, COLUMNS)


@app.command()
def delete(ctx: typer.Context, name: DeploymentArg, reason: ReasonOption = None, yes: YesOption = False) -> None:
    """Delete NAME; its engines are drained."""
    confirm(f"Delete deployment {name} (its engines will be drained)?", yes)
    client(ctx).delete_deployment(name, reason)
    status(f"deployment {name}: deleted; its engines are draining")
