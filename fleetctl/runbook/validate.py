"""Everything about a loaded runbook that the schema alone cannot see, each problem at its line:
- every `run` and `check` is a real `fleetctl` command with options it has (commands.py), so a runbook
  that names a command that was renamed or removed fails here instead of in an incident;
- a `check` takes `-o` (it is run with `-o json`) and does not give `-o` itself;
- a `run` of a command that asks first passes `--yes` (the runbook asks the operator itself);
- nothing runs in the foreground (`up`, `tui`, `... serve`) or runs another runbook;
- every `{var}` (in a command, a text, a path or an expected value) names a declared variable (or runbook, run_id), and every `ask` stores into a declared one;
- preconditions change nothing: say, check and ask only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetctl.runbook import jsonpath, template
from fleetctl.runbook.commands import FOREGROUND, CommandProblem, resolve
from fleetctl.runbook.errors import Problem, RunbookInvalid
from fleetctl.runbook.load import Loaded, load_file
from fleetctl.runbook.model import BUILTIN_VARS, Ask, Check, Run, Runbook, step_kind


def problems(loaded: Loaded, root: Any) -> list[Problem]:
    """Every problem of `loaded`, in file order, against the command tree under `root`."""
    runbook, found = loaded.runbook, []
    for phase, steps in runbook.phases():
        for index, step in enumerate(steps):
            loc = (phase, index)
            for field, message in step_problems(step, runbook, root, phase):
                found.append(loaded.problem((*loc, field), message))
    return sorted(found, key=lambda p: p.line)


def step_problems(step: Any, runbook: Runbook, root: Any, phase: str) -> list[tuple[str, str]]:
    kind = step_kind(step)
    out = [(field, message) for field, text in _texts(step) for message in _var_problems(text, runbook)]
    if phase == "preconditions" and isinstance(step, Run):
        out.append(("run", "preconditions change nothing: use say, check or ask (a `run` goes in steps)"))
    if isinstance(step, (Run, Check)):
        out += [(kind or "", message) for message in command_problems(getattr(step, kind or ""), isinstance(step, Check), root)]
    if isinstance(step, Check):
        out += [(f, bad) for f in ("path", "expect_path") if (bad := jsonpath.problem(getattr(step, f) or ""))]
    if isinstance(step, Ask):
        out += _ask_problems(step, runbook)
    return out


def command_problems(command: str, is_check: bool, root: Any) -> list[str]:
    try:
        words = template.split(command)
    except ValueError as exc:
        return [f"cannot split the command line: {exc}"]
    try:
        resolved = resolve([*words, "-o", "json"] if is_check else words, root)
    except CommandProblem as exc:
        if is_check and "No such option: -o" in str(exc):
            return [f"a check runs its command with -o json, and {' '.join(words)!r} takes no -o: {exc}"]
        return [str(exc)]
    return _use_problems(resolved, words, is_check)


def _use_problems(resolved: Any, words: list[str], is_check: bool) -> list[str]:
    name = f"fleetctl {resolved.path}"
    if resolved.path in FOREGROUND:
        return [f"{name!r} runs in the foreground until stopped: not a runbook step"]
    if resolved.path.split(" ")[0] == "runbook":
        return [f"{name!r}: a runbook does not run runbooks"]
    if is_check and ("-o" in words or "--output" in words or any(w.startswith("--output=") for w in words)):
        return [f"{name!r}: a check adds -o json itself; drop -o"]
    if not is_check and resolved.takes("--yes") and not resolved.given("yes"):
        return [f"{name!r} asks before it acts: pass --yes (the runbook confirms each step with the operator)"]
    return []


def _texts(step: Any) -> list[tuple[str, str]]:
    fields = ("say", "run", "check", "ask", "on_fail", "expect", "path", "expect_path")
    return [(f, getattr(step, f)) for f in fields if isinstance(getattr(step, f, None), str)]


def _var_problems(text: str, runbook: Runbook) -> list[str]:
    known = set(runbook.vars) | set(BUILTIN_VARS)
    return [f"{{{name}}} is not a declared variable (declare it under vars: {', '.join(sorted(runbook.vars)) or 'none yet'})"
            for name in dict.fromkeys(template.names(text)) if name not in known]


def _ask_problems(step: Ask, runbook: Runbook) -> list[tuple[str, str]]:
    out = []
    if step.var not in runbook.vars:
        out.append(("var", f"{step.var!r} is not a declared variable (declare it under vars)"))
    if step.choices and step.continue_if is not None and step.continue_if not in step.choices:
        out.append(("continue_if", f"{step.continue_if!r} is not one of the choices {step.choices}"))
    return out


def check_file(path: Path, root: Any) -> tuple[Loaded | None, list[Problem]]:
    """(the loaded runbook or None, every problem of the file at `path`), its id matching its file name."""
    try:
        loaded = load_file(path)
    except RunbookInvalid as exc:
        return None, exc.problems
    found = problems(loaded, root)
    if loaded.runbook.id != path.stem:
        found.insert(0, loaded.problem(("id",), f"id {loaded.runbook.id!r} differs from the file name {path.name!r} "
                                                "(a runbook is ID.yaml)"))
    return loaded, found
