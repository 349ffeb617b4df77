"""The Events screen: the fleet's event stream (the audit log, canary verdict changes, rollout
transitions), live, newest at the bottom, coloured by severity. It follows new events while the view is
at the bottom (the log is anchored); scrolled up, it stays where it is until scrolled back down or `G`.

`/` filters (ui/present/events.py: plain words, `source:canary`, `severity:alert`, `!word`), as it is
typed; enter keeps the filter, esc in the prompt clears it. The title line shows the filter and how many
events match. `G` jumps to the newest event and follows again.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Input, RichLog

from fleetctl.controller.watch_contract import FleetEventView
from fleetctl.watch_state import EVENTS_KEPT, Applied, FleetState
from ui.present import events as present
from ui.screens.base import BaseScreen

FILTER_HELP = "filter: words, source:canary|audit|rollout, severity:alert|warning|info, !word excludes"


class EventsScreen(BaseScreen):
    HEADING = "Events"
    FILTERABLE = True
    BINDINGS: ClassVar[list[BindingType]] = [Binding("G", "follow", "follow")]

    def __init__(self) -> None:
        super().__init__(name="events")
        self.event_filter = present.parse_filter("")
        self._fleet: FleetState | None = None
        self._shown = 0

    def compose_body(self) -> ComposeResult:
        yield RichLog(id="events-log", max_lines=EVENTS_KEPT, wrap=False, auto_scroll=False, markup=False)

    def on_mount(self) -> None:
        self.query_one("#events-log", RichLog).anchor()  # follows the bottom until scrolled up (Textual's anchor)
        self._draw_title()

    # --- state in ---

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        self._fleet = fleet
        if applied.reset:
            self._rewrite()
        elif applied.events:
            self._append(present.select(applied.events, self.event_filter))

    def _rewrite(self) -> None:
        log = self.query_one("#events-log", RichLog)
        log.clear()
        self._shown = 0
        self._append(present.select(self._fleet.events if self._fleet else (), self.event_filter))
        log.anchor()  # a new filter or a fresh snapshot shows the newest events

    def _append(self, events: list[FleetEventView]) -> None:
        log = self.query_one("#events-log", RichLog)
        for event in events:
            log.write(present.line(event), scroll_end=False)  # the anchor follows, unless scrolled up
        self._shown = min(self._shown + len(events), EVENTS_KEPT)
        self._draw_title()

    def _draw_title(self) -> None:
        total = len(self._fleet.events) if self._fleet else 0
        title = Text(f"Events: {min(self._shown, total)} of {total}")
        if self.event_filter.terms:
            title.append(f" · /{self.event_filter.text}", style="yellow")
        self.query_one("#events-log", RichLog).border_title = title

    # --- the filter (the base screen's `/` prompt) ---

    def action_prompt(self, mode: str) -> None:
        super().action_prompt(mode)
        if mode == "/":
            self.query_one("#prompt-input", Input).placeholder = FILTER_HELP

    def apply_filter(self, text: str) -> None:
        self.event_filter = present.parse_filter(text)
        self._rewrite()

    def action_follow(self) -> None:
        self.query_one("#events-log", RichLog).anchor()
