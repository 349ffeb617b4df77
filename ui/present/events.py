"""The Events screen's content: one line per FleetEventView, coloured by severity, and the `/` filter.

A filter is words separated by spaces, all of which an event must match (case-insensitive):
`source:canary`, `severity:alert`, `subject:chat@r2`, `actor:alice` match that field (a prefix of it for
source and severity: `sev:al` works too, `severity:warn` matches warning); any other word matches when
it appears in the source, severity, subject, message or actor. `!word` (or `!field:value`) excludes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.text import Text

from fleetctl.controller.watch_contract import FleetEventView
from ui.columns import Column, Fitted
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
    """'12:03:04 alert   canary  chat@r2  b8: healthy -> failing ...  (alice)'."""
    style = SEVERITY_STYLES.get(event.severity, "")
    text = Text.assemble((clock_time(event.at), "dim"), " ", (f"{event.severity:<7}", style or "dim"), " ",
                         (f"{event.source:<7}", "dim"), " ")
    return text.append_text(what(event))


def what(event: FleetEventView) -> Text:
    style = SEVERITY_STYLES.get(event.severity, "")
    text = Text.assemble((event.subject, "bold"), "  ", (event.message, style))
    if event.actor:
        text.append(f"  ({event.actor})", style="dim")
    return text


# --- the table's rows (a row provider for ui/widgets/table.VirtualTable) ---

COLUMNS = (
    Column("at", "TIME", 8),
    Column("severity", "SEVERITY", 8),
    Column("source", "SOURCE", 7),
    Column("subject", "SUBJECT", 10, 32),
    Column("message", "MESSAGE", 20, 400),
    Column("actor", "ACTOR", 8, 24, priority=2),
)
TONES = {"alert": "error", "warning": "pending", "info": ""}  # VirtualTable's row colours


class EventRows:
    """The events the screen may show, by id, and those the filter lets through, in order. Rebuilt from the
    app's FleetState's events (at most EVENTS_KEPT) on each change: events never change, only come and go."""

    def __init__(self) -> None:
        self.events: dict[str, FleetEventView] = {}
        self.order: list[str] = []

    def update(self, events: Iterable[FleetEventView], event_filter: EventFilter) -> None:
        self.events = {event.id: event for event in events}
        self.order = [key for key, event in self.events.items() if event_filter.matches(event)]

    def cells(self, key: str, fitted: Sequence[Fitted]) -> tuple[list[str], str]:
        event = self.events[key]
        values = {"at": clock_time(event.at), "severity": event.severity, "source": event.source,
                  "subject": event.subject, "message": event.message, "actor": event.actor or ""}
        return [values[f.column.key] for f in fitted], TONES.get(event.severity, "")

    def wanted_widths(self) -> dict[str, int]:
        wanted = {"subject": 7, "message": 7, "actor": 5}
        for event in self.events.values():
            wanted["subject"] = max(wanted["subject"], len(event.subject))
            wanted["message"] = max(wanted["message"], len(event.message))
            wanted["actor"] = max(wanted["actor"], len(event.actor or ""))
        return wanted
