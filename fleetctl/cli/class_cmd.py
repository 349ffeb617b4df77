"""`fleetctl class apply|get|list|history|diff`: replica classes from YAML files.

`class diff A B` compares two specs, each a stored revision (NAME@rN) or a file, field by field
(fleetctl/class_diff.py decides; this module fetches, prints and exits 0 or ExitCode.DIFFERS).
`class diff --live MODEL` compares what MODEL's running engines run with their class revisions
(class_live.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from fleetctl.cli import class_live
from fleetctl.cli.context import ReasonOption, client
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.output import Column, DetailOutputOption, Format, OutputOption, col, emit, status
from fleetctl.errors import ValidationFailed

if TYPE_CHECKING:
    from fleetctl.class_diff import ClassDiff
    from fleetctl.replica_class import ReplicaClassSpec

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


# --- class diff ---

@app.command("diff")
def diff_classes(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(help="a class revision NAME@rN or a class file; with --live: the MODEL",
                                     show_default=False)],
    b: Annotated[str | None, typer.Argument(help="a class revision NAME@rN or a class file (not with --live)",
                                            show_default=False)] = None,
    live: Annotated[bool, typer.Option("--live", help="compare each running engine of MODEL with its class "
                                       "revision: what it was launched with and what it reports")] = False,
    output: OutputOption = Format.table,
) -> None:
    """What differs from A to B, correctness-relevant fields first, and whether outputs may change; or, with
    --live MODEL, every running engine that differs from its class revision. Exit 0 when no
    correctness-relevant field differs (no engine drifted), 7 when one does."""
    if live:
        if b is not None:
            raise ValidationFailed("class diff --live takes one MODEL, not two classes", field="live")
        class_live.live_diff(ctx, a, output)
        return
    if b is None:
        raise ValidationFailed("class diff: give two classes A B (revisions or files), or --live MODEL", field="b")
    result = diff_pair(ctx, a, b)
    show_diff(result, output)
    raise typer.Exit(int(diff_exit_code(result)))


def diff_pair(ctx: typer.Context, a: str, b: str) -> "ClassDiff":
    """A against B, each a revision or a file."""
    from fleetctl.class_diff import compare  # lazily: replica_class's models cost every CLI start ~70 ms

    return compare(a, load_spec(ctx, a), b, load_spec(ctx, b))


def diff_exit_code(result: "ClassDiff") -> ExitCode:
    return ExitCode.DIFFERS if result.outputs_may_change else ExitCode.OK


def load_spec(ctx: typer.Context, source: str) -> "ReplicaClassSpec":
    """The spec of an existing file, else of the revision NAME@rN from the controller (NotFound: exit 3)."""
    from fleetctl.replica_class import REF_PATTERN

    path = Path(source)
    if path.exists():
        return validated_spec(spec_from_file(path), str(path))
    if REF_PATTERN.match(source):
        return validated_spec(client(ctx).get_class(source).spec, source)
    raise ValidationFailed(f"{source}: neither a class revision NAME@rN nor an existing file", field="class")


def spec_from_file(path: Path) -> dict[str, Any]:
    """`{name, spec}` as `class apply -f` takes it, or a bare spec mapping."""
    document = yaml.safe_load(path.read_text())
    if isinstance(document, dict) and ("spec" in document or "name" in document):
        return read_class_file(path)[1]
    if not isinstance(document, dict):
        raise ValidationFailed(f"{path}: expected a mapping: {{name, spec}} or a spec", field="file")
    return document


def validated_spec(spec: dict[str, Any], where: str) -> "ReplicaClassSpec":
    from pydantic import ValidationError

    from fleetctl.replica_class import ReplicaClassSpec

    try:
        return ReplicaClassSpec.model_validate(spec)
    except ValidationError as exc:
        field, message = _first_error(exc)
        raise ValidationFailed(f"{where}: {field}: {message}" if field else f"{where}: {message}",
                               field=field) from None


def _first_error(exc: Any) -> tuple[str | None, str]:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"]) or None
    message = str(error["msg"]).removeprefix("Value error, ")
    return (f"spec.{field}" if field else None), message


def show_diff(result: "ClassDiff", output: Format) -> None:
    if output is not Format.table:
        emit(result.to_json(), output)
        return
    typer.echo("\n".join(diff_lines(result)))


def diff_lines(result: "ClassDiff") -> list[str]:
    lines = [f"A: {result.a}", f"B: {result.b}"]
    for title, marker, changes in (("correctness-relevant (can change tokens)", "!", result.correctness),
                                   ("performance-only (cannot change tokens)", " ", result.performance)):
        if changes:
            lines += ["", f"{title}:"] + [f"  {marker} {c.field}: {_shown(c.old)} → {_shown(c.new)}" for c in changes]
    return lines + ["", result.verdict_line()]


def _shown(value: Any) -> str:
    from fleetctl.class_diff import format_value

    return format_value(value)
