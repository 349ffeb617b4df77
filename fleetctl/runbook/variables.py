"""A run's variables: `--var NAME=VALUE` from the command line over the runbook's defaults, checked against
what the runbook declares."""

from __future__ import annotations

from fleetctl.runbook.errors import BadVars
from fleetctl.runbook.model import Ask, Runbook


def parse(pairs: list[str], runbook: Runbook) -> dict[str, str]:
    """`--var` values by name; BadVars for a malformed pair or a name the runbook does not declare."""
    given: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise BadVars(f"--var {pair!r}: write NAME=VALUE", field="var")
        if name not in runbook.vars:
            declared = ", ".join(sorted(runbook.vars)) or "none"
            raise BadVars(f"--var {name}: runbook {runbook.id!r} has no variable {name!r} (it has: {declared})",
                          field="var")
        given[name] = value
    return given


def asked(runbook: Runbook) -> set[str]:
    """Variables an `ask` step sets while the runbook runs."""
    return {s.var for _phase, steps in runbook.phases() for s in steps if isinstance(s, Ask)}


def with_defaults(runbook: Runbook, given: dict[str, str]) -> dict[str, str]:
    values = {name: var.default for name, var in runbook.vars.items() if var.default is not None}
    return {**values, **given}


def missing(runbook: Runbook, values: dict[str, str], interactive: bool) -> list[str]:
    """Declared variables without a value that the run needs before it starts: all of them without --yes
    except those a question sets; with --yes, the questions' answers too."""
    later = asked(runbook) if interactive else set()
    return [name for name in runbook.vars if name not in values and name not in later]
