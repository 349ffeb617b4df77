"""The Fleet screen's `/` filter: space-separated terms, all of which must match; a plain term matches the
node, engine, model, role, class or state; `field:text` matches one field (node, engine, model, role, class,
state); `!term` excludes. Matching is case-insensitive substring.

    terms = parse_filter("role:decode !node-3")
    shown = all(term.matches(row) for term in terms)   # row: anything with field(name) -> str
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

FILTER_FIELDS = ("node", "engine", "model", "role", "class", "state")


class Row(Protocol):
    def field(self, name: str) -> str: ...


@dataclass(frozen=True)
class Term:
    field: str | None  # None: any field
    text: str
    negated: bool = False

    def matches(self, row: Row) -> bool:
        fields = FILTER_FIELDS if self.field is None else (self.field,)
        found = any(self.text in row.field(name).lower() for name in fields)
        return found != self.negated


def parse_filter(text: str) -> tuple[Term, ...]:
    terms = []
    for word in text.lower().split():
        negated = word.startswith("!")
        word = word[1:] if negated else word
        field, _, value = word.partition(":")
        if value and field in FILTER_FIELDS:
            terms.append(Term(field, value, negated))
        elif word:
            terms.append(Term(None, word, negated))
    return tuple(terms)
