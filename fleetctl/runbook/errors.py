"""The runbook package's errors: a bad runbook file (each problem with its file and line), and a runbook or
variable the command line names that does not exist. Both are ValidationFailed, so the CLI exits 2 with
one line (fleetctl/cli/failures.py)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetctl.errors import NotFound, ValidationFailed


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a runbook file: `file:line: where: message`."""

    source: str  # the file (or "<text>")
    line: int  # 1-based; the line of the offending item, or of the nearest enclosing one
    where: str  # the dotted location in the runbook (`steps.3.run`), or "" for the file itself
    message: str

    def __str__(self) -> str:
        where = f" {self.where}:" if self.where else ""
        return f"{self.source}:{self.line}:{where} {self.message}"


class RunbookInvalid(ValidationFailed):
    """A runbook that does not load or does not validate; `problems` holds every problem, the message the first."""

    code = "runbook_invalid"

    def __init__(self, problems: list[Problem]):
        first = str(problems[0])
        more = f" (and {len(problems) - 1} more: see `fleetctl runbook validate`)" if len(problems) > 1 else ""
        super().__init__(first + more)
        self.problems = problems


class RunbookNotFound(NotFound):
    code = "runbook_not_found"


class BadVars(ValidationFailed):
    """A `--var` the runbook does not declare, malformed, or a required variable without a value."""

    code = "bad_var"
