"""The Events screen's content: one line per FleetEventView, coloured by severity, and the `/` filter.

A filter is words separated by spaces, all of which an event must match (case-insensitive):
`source:canary`, `severity:alert`, `subject:chat@r2`, `actor:alice` match that field (a prefix of it for
source and severity: `sev:al` works too, `severity:warn` matches warning); any other word matches when
it appears in the source, severity, subject, message or actor. `!word` (or `!field:value`) excludes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text

from fleetctl.controller.watch_contract import FleetEventView
from ui.present.timefmt import clock_time

SEVERITY_STYLES = {"info": "", "warning": "dark_orange", "alert": "bold orange_red1"}
FIELDS = {"source": "source", "src": "source", "severity": "severity", "sev": "severity",
          "subject": "subject", "actor": "actor", "message": "message", "msg": "message"}
PREFIX_FIELDS = frozenset({"source", "severity"})


@dataclass(frozen=True)
class Term:
    field: str | None  # None: any field
    value: str
    negated: bool = False

    def matches(self, event: FleetEventView) -> bool:
        return self._hit(event) != self.negated

    def _hit(self, event: FleetEventView) -> bool:
        if self.field is None:
            haystack = " ".join((event.source, event.severity, event.subject, event.message, event.actor or ""))
            return self.value in haystack.lower()
        value = (getattr(event, self.field) or "").lower()
        return value.startswith(self.value) if self.field in PREFIX_FIELDS else self.value in value


@dataclass(frozen=True)
class EventFilter:
    text: str
    terms: tuple[Term, ...]

    def matches(self, event: FleetEventView) -> bool:
        return all(term.matches(event) for term in self.terms)


def parse_filter(text: str) -> EventFilter:
    terms = []
    for word in text.lower().split():
        negated = word.startswith("!") and len(word) > 1
        word = word[1:] if negated else word
        name, sep, value = word.partition(":")
        if sep and name in FIELDS and value:
            terms.append(Term(FIELDS[name], value, negated))
        else:
            terms.append(Term(None, word, negated))
    return EventFilter(text.strip(), tuple(terms))


def select(events: Iterable[FleetEventView], event_filter: EventFilter) -> list[FleetEventView]:
    return [event for event in events if event_filter.matches(event)]


def line(event: FleetEventView) -> Text:
    """'12:03:04 alert   canary  smollm2/chat@r2 b8  drifting -> failing ...  (alice)'."""
    style = SEVERITY_STYLES.get(event.severity, "")
    text = Text.assemble((clock_time(event.at), "dim"), " ", (f"{event.severity:<7}", style or "dim"), " ",
                         (f"{event.source:<7}", "dim"), " ", (event.subject, "bold"), "  ", (event.message, style))
    if event.actor:
        text.append(f"  ({event.actor})", style="dim")
    return text
