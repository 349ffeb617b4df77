"""`fleetctl class apply|get|list|history|diff`: replica classes from YAML files; `diff --live` (class_live.py)
compares running engines with their class revision."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from fleetctl.cli import class_live
from fleetctl.cli.context import ReasonOption, client
from fleetctl.cli.output import Column, DetailOutputOption, Format, OutputOption, col, emit, status
from fleetctl.errors import ValidationFailed

CORRECTNESS = "correctness"  # replica_class.CORRECTNESS (not imported: building its models costs every CLI start ~70 ms)

NAME = "class"
app = typer.Typer(no_args_is_help=True, help="Replica classes: apply, get, list, history, diff.")

REVISION_COLUMNS = [col("CLASS", "ref"), col("RESULT", "result"), Column("DIGEST", lambda r: r["digest"][:12])]
LIST_COLUMNS = [col("CLASS", "name"), col("LATEST", "latest"), col("REVISIONS", "revisions"), col("MODEL", "model"),
                col("BACKEND", "backend")]
HISTORY_COLUMNS = [col("REVISION", "ref"), col("CREATED", "created_at"), col("BY", "created_by"),
                   Column("CHANGES", lambda r: _change_summary(r["changes"]))]


def read_class_file(path: Path) -> tuple[str, dict[str, Any]]:
    """A YAML (or JSON) file {name: ..., spec: {...}}; the spec itself is validated by the controller."""
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValidationFailed(f"{path}: expected a mapping with 'name' and 'spec'", field="file")
    unknown = sorted(set(document) - {"name", "spec"})
    if unknown:
        raise ValidationFailed(f"{path}: unknown top-level field {unknown[0]!r} (expected name, spec)", field=unknown[0])
    name, spec = document.get("name"), document.get("spec")
    if not isinstance(name, str) or not name.strip():
        raise ValidationFailed(f"{path}: 'name' is missing or blank", field="name")
    if not isinstance(spec, dict):
        raise ValidationFailed(f"{path}: 'spec' is missing or not a mapping", field="spec")
    return name, spec


@app.command()
def apply(ctx: typer.Context,
          file: Annotated[Path, typer.Option("--file", "-f", help="class YAML file: {name: ..., spec: {...}}")],
          reason: ReasonOption = None, output: OutputOption = Format.table) -> None:
    """Create the next revision from FILE, or nothing if its content is already a revision."""
    name, spec = read_class_file(file)
    revision = client(ctx).apply_class(name, spec, reason)
    status(f"class {revision.ref}: " + ("created" if revision.result == "created" else "unchanged (identical content)"))
    emit(revision, output, REVISION_COLUMNS)


@app.command()
def get(ctx: typer.Context, ref: Annotated[str, typer.Argument(help="NAME (latest) or NAME@rN")],
        output: DetailOutputOption = Format.yaml) -> None:
    """One revision with its spec."""
    emit(client(ctx).get_class(ref), output, [col("CLASS", "ref"), col("CREATED", "created_at"), col("BY", "created_by")])


@app.command("list")
def list_classes(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """All classes with their latest revision."""
    emit(client(ctx).list_classes(), output, LIST_COLUMNS)


@app.command()
def history(ctx: typer.Context, name: Annotated[str, typer.Argument(help="class name")],
            output: OutputOption = Format.table) -> None:
    """Every revision and what changed from the one before; '!' marks correctness fields (they can change tokens)."""
    revisions = client(ctx).class_history(name)
    emit(revisions, output, HISTORY_COLUMNS)
    if output is Format.table:
        for before, after in zip(revisions, revisions[1:]):
            typer.echo(f"\n{before.ref} -> {after.ref}")
            typer.echo(format_changes([change.model_dump() for change in after.changes]))


@app.command()
def diff(ctx: typer.Context,
         target: Annotated[str, typer.Argument(help="with --live: the MODEL whose running engines to compare")],
         live: Annotated[bool, typer.Option("--live", help="compare each running engine of MODEL with its class "
                                            "revision: what it was launched with and what it reports")] = False,
         output: OutputOption = Format.table) -> None:
    """With --live: every difference between what MODEL's engines run and their class revisions; exit 7 if any."""
    if not live:
        raise ValidationFailed("class diff: pass --live MODEL to compare running engines with their class", field="live")
    class_live.live_diff(ctx, target, output)


def format_changes(changes: list[dict[str, Any]]) -> str:
    if not changes:
        return "  (no field changes)"
    return "\n".join(
        f"  {'!' if c['tag'] == CORRECTNESS else ' '} {c['field']}: {c['old']!r} -> {c['new']!r}  ({c['tag']})"
        for c in changes
    )


def _change_summary(changes: list[dict[str, Any]]) -> str:
    if not changes:
        return "-"
    correctness = sum(c["tag"] == CORRECTNESS for c in changes)
    fields = ", ".join(c["field"] for c in changes)
    return f"{fields} ({correctness} correctness)" if correctness else fields
