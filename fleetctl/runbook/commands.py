"""Resolving a runbook's `fleetctl ...` words in the real command tree (fleetctl.cli.main.app), without
running anything: the command must exist, its options must be its own, its required arguments present.

The tree (the CLI's root command, handed in) is walked with the command's own parser (typer's click), group by group, as `fleetctl` itself
parses; values are not converted (a `{var}` may stand where a number goes), so a bad value is found when the
step runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperGroup

PROGRAM = "fleetctl"
# commands that run in the foreground until stopped (or take over the terminal): never a runbook step
FOREGROUND = frozenset({"up", "tui", "controller serve", "agent serve", "engine serve", "gateway serve"})


class CommandProblem(ValueError):
    """Why a command line does not resolve (one readable line)."""


@dataclass(frozen=True)
class Resolved:
    path: str  # `node drain`
    command: Any  # the leaf command (typer's click Command)
    options: dict[str, Any]  # parameter name -> raw value as parsed

    def takes(self, flag: str) -> bool:
        return any(flag in p.opts or flag in getattr(p, "secondary_opts", ()) for p in self.command.params)

    def given(self, name: str) -> bool:
        return self.options.get(name) not in (None, False, ())


def resolve(words: list[str], root: Any) -> Resolved:
    """The command `words` (starting with `fleetctl`) name in the tree under `root` (the CLI passes
    `typer.main.get_command(app)`: this package does not import the CLI); CommandProblem otherwise."""
    if not words or words[0] != PROGRAM:
        raise CommandProblem(f"a command starts with {PROGRAM!r}: {' '.join(words)!r}")
    command, ctx, rest, path = root, None, words[1:], []
    while True:
        ctx = typer.Context(command, info_name=path[-1] if path else PROGRAM, parent=ctx)
        options, rest = _parse(command, ctx, rest, " ".join([PROGRAM, *path]))
        subcommands = getattr(command, "commands", None)
        if not isinstance(command, TyperGroup) or not subcommands:
            _check_complete(command, options, rest, " ".join([PROGRAM, *path]))
            return Resolved(" ".join(path), command, options)
        if not rest:
            raise CommandProblem(f"{' '.join([PROGRAM, *path])!r} needs a command: {', '.join(sorted(subcommands))}")
        if rest[0] not in subcommands:
            raise CommandProblem(f"no such command {' '.join([PROGRAM, *path, rest[0]])!r}")
        path.append(rest[0])
        command, rest = subcommands[rest[0]], rest[1:]


def _parse(command: Any, ctx: Any, words: list[str], where: str) -> tuple[dict[str, Any], list[str]]:
    try:
        options, rest, _order = command.make_parser(ctx).parse_args(args=list(words))
    except typer.TyperException as exc:  # no such option, an option without its value
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise CommandProblem(f"{where!r}: {message}") from None
    return options, rest


def _check_complete(command: Any, options: dict[str, Any], rest: list[str], where: str) -> None:
    if rest:
        raise CommandProblem(f"{where!r}: unexpected argument(s) {' '.join(rest)!r}")
    for param in command.params:
        if param.required and options.get(param.name) in (None, ()):
            label = param.opts[0] if param.opts and param.opts[0].startswith("-") else param.name.upper()
            raise CommandProblem(f"{where!r}: missing {label}")
