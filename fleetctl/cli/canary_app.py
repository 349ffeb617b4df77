"""The `fleetctl canary` Typer app; its commands live in the canary_*.py modules that canary_cmd imports."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="The quality canary: golden sets and references, probe verdicts per class revision and batch size.",
    no_args_is_help=True,
)
