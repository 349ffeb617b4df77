"""`{var}` placeholders: which a text names, and substitution into a command's words.

A command line is split into words first (shell quoting rules, no shell runs) and each word substituted
after, so a value with spaces stays one argument and no value can inject options or a second command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def names(text: str) -> list[str]:
    return PLACEHOLDER.findall(text)


def fill(text: str, values: Mapping[str, str], keep_unknown: bool = False) -> str:
    """`text` with each `{name}` replaced; KeyError for a name without a value unless `keep_unknown`."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in values:
            return values[name]
        if keep_unknown:
            return match.group(0)
        raise KeyError(name)

    return PLACEHOLDER.sub(one, text)


def split(command: str) -> list[str]:
    """The words of a command line; ValueError for unbalanced quotes."""
    return shlex.split(command)


def fill_words(command: str, values: Mapping[str, str], keep_unknown: bool = False) -> list[str]:
    return [fill(word, values, keep_unknown) for word in split(command)]


def shown(argv: list[str]) -> str:
    return shlex.join(argv)
