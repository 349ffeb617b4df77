"""YAML to a Runbook, with every problem reported at its line.

The text is composed into YAML nodes (which keep their position) and constructed from the same nodes, so a
pydantic error's location (`steps.3.expect`) maps back to the node it names; a missing field is reported at
the line of the mapping that lacks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fleetctl.runbook.errors import Problem, RunbookInvalid
from fleetctl.runbook.model import STEP_KINDS, Runbook

STEP_LISTS = ("preconditions", "steps", "rollback")


class Loaded:
    """A parsed runbook with the YAML nodes it came from (so later checks can name lines too)."""

    def __init__(self, runbook: Runbook, root: yaml.Node, source: str):
        self.runbook, self.root, self.source = runbook, root, source

    def problem(self, loc: tuple[Any, ...], message: str) -> Problem:
        return Problem(self.source, line_of(self.root, loc), dotted(loc), message)


def load_file(path: Path) -> Loaded:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RunbookInvalid([Problem(str(path), 1, "", f"cannot read: {exc.strerror or exc}")]) from None
    return load_text(text, str(path))


def load_text(text: str, source: str = "<text>") -> Loaded:
    root, data = _compose(text, source)
    try:
        runbook = Runbook.model_validate(data)
    except ValidationError as exc:
        raise RunbookInvalid([_problem(root, source, error) for error in exc.errors()]) from None
    return Loaded(runbook, root, source)


def _compose(text: str, source: str) -> tuple[yaml.Node, Any]:
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise RunbookInvalid([Problem(source, 1, "", "empty file: a runbook is a mapping with id, title, steps")])
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise RunbookInvalid([Problem(source, line, "", f"invalid YAML: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise RunbookInvalid([Problem(source, 1, "", f"invalid YAML: {' '.join(str(exc).split())}")]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise RunbookInvalid([Problem(source, root.start_mark.line + 1, "", "a runbook is a mapping with id, title, steps")])
    return root, data


def _problem(root: yaml.Node, source: str, error: Any) -> Problem:
    loc = without_tags(tuple(error["loc"]))
    message = error["msg"]
    if error["type"] == "missing":
        message = f"missing field {loc[-1]!r}"
        where, node_loc = dotted(loc[:-1]), loc[:-1]
    elif error["type"] == "extra_forbidden":
        message = f"unknown field {loc[-1]!r}" + (" (a step's kind is one of: say, run, check, ask)"
                                                   if _in_step(loc) else "")
        where, node_loc = dotted(loc), loc
    else:
        where, node_loc = dotted(loc), loc
    return Problem(source, line_of(root, node_loc), where, message.removeprefix("Value error, "))


def without_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """pydantic puts a step's union tag in the location (`steps.3.check.expect`); the YAML has no such level."""
    out: list[Any] = []
    for item in loc:
        if item in STEP_KINDS and len(out) == 2 and out[0] in STEP_LISTS and isinstance(out[1], int):
            continue
        out.append(item)
    return tuple(out)


def _in_step(loc: tuple[Any, ...]) -> bool:
    return len(loc) == 3 and loc[0] in STEP_LISTS and isinstance(loc[1], int)


def dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def line_of(root: yaml.Node, loc: tuple[Any, ...]) -> int:
    """The 1-based line of the node at `loc` (of a mapping key for a mapping entry), or of the deepest node on
    the way that exists."""
    node, line = root, root.start_mark.line + 1
    for part in loc:
        found = _child(node, part)
        if found is None:
            break
        key, node = found
        line = (key or node).start_mark.line + 1
    return line


def _child(node: yaml.Node, part: Any) -> tuple[yaml.Node | None, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key, value
        return None
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return None, node.value[part]
    return None
