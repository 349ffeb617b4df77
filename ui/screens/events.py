"""The Events screen: the fleet's event stream (the audit log, canary verdict changes, rollout
transitions), live, newest at the bottom, a row each, alerts in orangered and warnings in darkorange. The
table follows new events while its cursor is on the newest; moved up, it stays on its event until `G` (or
end) brings it back down. The selected event is written out in full below the table.

`/` filters (ui/present/events.py: plain words, `source:canary`, `severity:alert`, `!word`), as it is
typed; enter keeps the filter, esc in the prompt clears it. The table's title shows the filter and how
many events match. The table renders only the rows on screen (ui/widgets/table.py), so a filter over the
1,000 events kept costs the same as one over ten.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Input, Static

from fleetctl.watch_state import Applied, FleetState
from ui.present import events as present
from ui.screens.base import BaseScreen
from ui.widgets.table import VirtualTable

FILTER_HELP = "filter: words, source:canary|audit|rollout, severity:alert|warning|info, !word excludes"
NO_EVENTS = "no events yet"


class EventTable(VirtualTable):
    """The events' table: says when its cursor moves (the screen writes the event out in full)."""

    class CursorMoved(Message):
        """The cursor moved (keys, mouse)."""

    def _set_cursor(self, index: int) -> None:
        before = self.cursor_row
        super()._set_cursor(index)
        if self.cursor_row != before:
            self.post_message(self.CursorMoved())


class EventsScreen(BaseScreen):
    HEADING = "Events"
    FILTERABLE = True
    BINDINGS: ClassVar[list[BindingType]] = [Binding("G", "follow", "follow")]
    HELP_EXTRA = (("/", "filter: words, source:canary, severity:alert, subject:…, actor:…, !term excludes"),)

    def __init__(self) -> None:
        super().__init__(name="events")
        self.event_filter = present.parse_filter("")
        self.rows = present.EventRows()
        self._total = 0

    @property
    def table(self) -> EventTable:
        return self.query_one("#events-table", EventTable)

    def compose_body(self) -> ComposeResult:
        yield EventTable(present.COLUMNS, self.rows, empty_text=NO_EVENTS, id="events-table")
        yield Static(id="event-detail")

    def on_mount(self) -> None:
        self.table.focus()
        self._draw_title()

    # --- state in ---

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        if applied.reset or applied.events:
            self._show(fleet)

    def _show(self, fleet: FleetState) -> None:
        table = self.table
        following = not table.keys or table.cursor_row >= len(table.keys) - 1
        self.rows.update(fleet.events, self.event_filter)
        self._total = len(fleet.events)
        table.set_order(self.rows.order)
        table.rows_changed()  # the columns refit to what the events need
        if following:
            table.action_last()
        self._draw_title()
        self._draw_detail()

    def _draw_title(self) -> None:
        title = Text(f"Events: {len(self.rows.order)} of {self._total}")
        if self.event_filter.terms:
            title.append(f" · /{self.event_filter.text}", style="yellow")
        self.table.border_title = title

    def _draw_detail(self) -> None:
        key = self.table.cursor_key
        event = self.rows.events.get(key) if key else None
        detail = self.query_one("#event-detail", Static)
        detail.display = event is not None
        if event is not None:
            detail.update(present.line(event))

    def on_event_table_cursor_moved(self, _message: EventTable.CursorMoved) -> None:
        self._draw_detail()

    # --- the filter (the base screen's `/` prompt) ---

    def action_prompt(self, mode: str) -> None:
        super().action_prompt(mode)
        if mode == "/":
            self.query_one("#prompt-input", Input).placeholder = FILTER_HELP

    def apply_filter(self, text: str) -> None:
        self.event_filter = present.parse_filter(text)
        self._show(self.fleet_app.fleet)
        self.table.action_last()  # a new filter shows the newest events

    def action_follow(self) -> None:
        self.table.action_last()
        self._draw_detail()
