"""`fleetctl runbook list|show|validate|run`: runbooks as procedures the CLI runs (docs/runbooks/README.md).

`run` is interactive by default: each step is shown, confirmed (yes / skip / abort), run and checked; a
failed step stops the run with what to do next and offers the rollback. `--yes` runs it unattended (every
question answered by `--var`, the rollback run on failure); `--dry-run` shows every step with its variables
filled and runs nothing. The run's start, each step's outcome and its finish go to the audit log.

Exit codes: 0 completed (or dry run), 1 a step failed or the run was aborted or stopped, 2 an invalid runbook
or `--var`, 5 a precondition does not hold (nothing was changed), 130 Ctrl-C.
"""

from __future__ import annotations

import functools
import secrets
import time
from typing import Annotated, Any

import typer

from fleetctl.cli.context import YesOption, cli
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status
from fleetctl.cli.runbook_io import AuditSink, Executor, Terminal
from fleetctl.runbook import variables
from fleetctl.runbook.errors import BadVars, RunbookInvalid
from fleetctl.runbook.load import Loaded
from fleetctl.runbook.runner import AuditEvent, Options, Runner, RunResult, Surroundings
from fleetctl.runbook.shipped import locate, runbook_dir, shipped
from fleetctl.runbook.validate import check_file

NAME = "runbook"
app = typer.Typer(no_args_is_help=True, help="Runbooks: list, show, validate, run (interactive, or --yes).")

RunbookArg = Annotated[str, typer.Argument(help="a runbook id (docs/runbooks/ID.yaml, or $FLEET_RUNBOOK_DIR) "
                                                "or a path to a runbook file", show_default=False)]
VarOption = Annotated[list[str] | None, typer.Option("--var", help="NAME=VALUE for a runbook variable (repeat)",
                                                     show_default=False)]

LIST_COLUMNS = [col("ID", "id"), col("TITLE", "title"), col("STEPS", "steps"), col("PROBLEMS", "problems")]
STEP_COLUMNS = [Column("PHASE", lambda r: r["phase"]), col("#", "step"), col("KIND", "kind"), col("OUTCOME", "outcome"),
                Column("WHAT", lambda r: r["text"] if r["outcome"] in ("ok", "dry_run") or not r["detail"]
                       else f"{r['text']} ({r['detail']})")]
EXIT = {"completed": ExitCode.OK, "dry_run": ExitCode.OK, "precondition_failed": ExitCode.REFUSED}


@functools.cache
def command_tree() -> Any:
    """The root of the `fleetctl` command tree, which runbook commands must resolve in."""
    from fleetctl.cli.main import app as root_app  # main imports this module: look it up when first asked

    return typer.main.get_command(root_app)


def load_valid(name: str) -> Loaded:
    """The runbook NAME (id or file), valid; RunbookInvalid (exit 2) with its first problem's line otherwise."""
    loaded, problems = check_file(locate(name), command_tree())
    if problems:
        raise RunbookInvalid(problems)
    assert loaded is not None
    return loaded


@app.command("list")
def list_runbooks(output: OutputOption = Format.table) -> None:
    """The runbooks in the runbook directory, each with its problems if it does not validate."""
    rows = []
    for path in shipped():
        loaded, problems = check_file(path, command_tree())
        book = loaded.runbook if loaded else None
        rows.append({"id": book.id if book else path.stem, "title": book.title if book else None,
                     "steps": len(book.steps) if book else None, "problems": len(problems), "file": str(path)})
    if not rows:
        status(f"no runbooks in {runbook_dir()}")
    emit(rows, output, LIST_COLUMNS)


@app.command("show")
def show(name: RunbookArg, output: OutputOption = Format.table) -> None:
    """A runbook: what it is for, its variables, preconditions, steps and rollback."""
    book = load_valid(name).runbook
    if output is not Format.table:
        emit(book.model_dump(mode="json", exclude_defaults=True), output)
        return
    typer.echo(render(book.model_dump(mode="json", exclude_defaults=True)))


def render(book: dict[str, Any]) -> str:
    lines = [f"{book['id']}: {book['title']}"]
    lines += [f"  symptom: {s}" for s in book.get("symptoms", [])]
    for name, var in book.get("vars", {}).items():
        default = f" (default {var['default']})" if "default" in var else " (required)"
        lines.append(f"  var {name}{default}: {var.get('description', '')}")
    for phase in ("preconditions", "steps", "rollback"):
        if book.get(phase):
            lines.append(f"{phase}:")
            lines += [f"  {i}. {_step_line(step)}" for i, step in enumerate(book[phase], start=1)]
    return "\n".join(lines)


def _step_line(step: dict[str, Any]) -> str:
    kind = next(k for k in ("say", "run", "check", "ask") if k in step)
    if kind == "check":
        wanted = step["expect_path"] if "expect_path" in step else repr(step.get("expect"))
        return f"check: {step['check']} -> {step.get('path') or '(output)'} {step.get('op', 'eq')} {wanted}"
    return f"{kind}: {step[kind]}"


@app.command("validate")
def validate(
    names: Annotated[list[str] | None, typer.Argument(help="runbook ids or files [default: every runbook in the "
                                                           "runbook directory]", show_default=False)] = None,
    output: OutputOption = Format.table,
) -> None:
    """Check runbooks without running them: the format, every command against this fleetctl's commands, every
    variable declared. Exit 2 if any has a problem (each printed as FILE:LINE: where: what)."""
    paths = [locate(n) for n in names] if names else shipped()
    rows = []
    for path in paths:
        _loaded, problems = check_file(path, command_tree())
        for problem in problems:
            status(f"error: {problem}")
        rows.append({"file": str(path), "ok": not problems, "problems": [str(p) for p in problems]})
    emit(rows, output, [col("FILE", "file"), col("OK", "ok"), Column("PROBLEMS", lambda r: len(r["problems"]))])
    if any(not row["ok"] for row in rows):
        raise typer.Exit(int(ExitCode.USAGE))


@app.command("run")
def run(
    ctx: typer.Context,
    name: RunbookArg,
    var: VarOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show every step with its variables filled; run "
                                                            "nothing, record nothing")] = False,
    yes: YesOption = False,
    no_rollback: Annotated[bool, typer.Option("--no-rollback", help="never run the rollback steps")] = False,
    output: OutputOption = Format.table,
) -> None:
    """Run a runbook: each step shown, confirmed, run and checked (--yes: unattended). A failed step stops the
    run with what to do next, then the rollback is offered (--yes: run)."""
    book = load_valid(name).runbook
    values = run_values(book, var or [], interactive=not yes, dry_run=dry_run)
    run_id = secrets.token_hex(4)
    options = Options(interactive=not yes, dry_run=dry_run, rollback=not no_rollback)
    if not dry_run:
        status(f"runbook {book.id} (run {run_id}): {book.title}")
    sink = AuditSink(cli(ctx))
    io = Surroundings(execute=Executor(cli(ctx)), show=status, confirm=Terminal.confirm, answer=Terminal.answer,
                      offer_rollback=Terminal.offer_rollback, audit=sink, clock=time.monotonic, sleep=time.sleep)
    try:
        result = Runner(book, values, run_id, io, options).run()
    except KeyboardInterrupt:
        if not dry_run:
            sink(AuditEvent("finish", book.id, run_id, "aborted", detail="interrupted (Ctrl-C)"))
        status(f"interrupted: runbook {book.id} run {run_id} stopped where it was; see `fleetctl audit list`")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    report(result, output)
    raise typer.Exit(int(EXIT.get(result.outcome, ExitCode.ERROR)))


def run_values(book: Any, pairs: list[str], interactive: bool, dry_run: bool) -> dict[str, str]:
    """The run's variables: --var over defaults; a missing one asked for (interactive), left as {NAME} (dry
    run), or an error naming it (--yes)."""
    values = variables.with_defaults(book, variables.parse(pairs, book))
    for missing in variables.missing(book, values, interactive):
        description = book.vars[missing].description
        if dry_run:
            status(f"note: no value for {{{missing}}} ({description}): shown as a placeholder")
        elif interactive:
            values[missing] = typer.prompt(f"{missing} ({description})" if description else missing, err=True)
        else:
            raise BadVars(f"--yes needs every variable: --var {missing}=... ({description or 'no default'})",
                          field="var")
    return values


def report(result: RunResult, output: Format) -> None:
    data = result.plain()
    if output is Format.table:
        status(f"runbook {result.runbook}: {result.outcome}" +
               (f" (rollback: {result.rollback})" if result.rollback != "not_needed" else ""))
        emit(data["steps"], output, STEP_COLUMNS)
        if result.next_action:
            status(f"next: {result.next_action}")
        return
    emit(data, output)
