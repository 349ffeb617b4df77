"""The Events screen: the fleet's event stream (the audit log, canary verdict changes, rollout
transitions), live, newest at the bottom, coloured by severity. It follows new events while the view is
at the bottom; scrolled up, it stays where it is until scrolled back down.

`/` filters (ui/present/events.py: plain words, `source:canary`, `severity:alert`, `!word`); enter keeps
the filter and goes back to the events, esc in the filter field clears it. The title line shows the
filter and how many events match.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input, RichLog, Static

from fleetctl.controller.watch_contract import FleetEventView
from fleetctl.watch_state import EVENTS_KEPT, Applied, FleetState
from ui.present import events as present
from ui.screens.base import BaseScreen

FILTER_HELP = "filter: words, source:canary|audit|rollout, severity:alert|warning|info, !word excludes"


class FilterInput(Input):
    """The filter field: esc clears the filter and closes the field (before the screen's esc goes back)."""

    BINDINGS = [Binding("escape", "clear", "Clear filter")]

    class Cleared(Message):
        """The operator cleared the filter with esc."""

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.Cleared())


class EventsScreen(BaseScreen):
    BINDINGS = [Binding("slash", "filter", "Filter"), Binding("G", "follow", "Follow")]

    def __init__(self) -> None:
        super().__init__()
        self.event_filter = present.parse_filter("")
        self._fleet: FleetState | None = None
        self._shown = 0

    def compose_body(self) -> ComposeResult:
        yield Static(id="events-title")
        yield RichLog(id="events-log", max_lines=EVENTS_KEPT, wrap=False, auto_scroll=False, markup=False)
        yield FilterInput(placeholder=FILTER_HELP, id="events-filter")

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
        events = present.select(self._fleet.events if self._fleet else (), self.event_filter)
        self._write(log, events, follow=True)

    def _append(self, events: list[FleetEventView]) -> None:
        if events:
            log = self.query_one("#events-log", RichLog)
            self._write(log, events, follow=log.is_vertical_scroll_end)
        else:
            self._draw_title()

    def _write(self, log: RichLog, events: list[FleetEventView], *, follow: bool) -> None:
        for event in events:
            log.write(present.line(event), scroll_end=follow)
        self._shown = min(self._shown + len(events), EVENTS_KEPT)
        self._draw_title()

    def _draw_title(self) -> None:
        total = len(self._fleet.events) if self._fleet else 0
        title = Text.assemble(("events ", "bold"), (f"{self._shown} of {total}", "dim"))
        if self.event_filter.terms:
            title.append("  filter: ", style="bold")
            title.append(self.event_filter.text, style="yellow")
        self.query_one("#events-title", Static).update(title)

    # --- the filter ---

    def action_filter(self) -> None:
        field = self.query_one("#events-filter", Input)
        field.display = True
        field.value = self.event_filter.text
        field.focus()

    def action_follow(self) -> None:
        self.query_one("#events-log", RichLog).scroll_end(animate=False)

    def set_filter(self, text: str) -> None:
        self.event_filter = present.parse_filter(text)
        self._rewrite()

    @on(Input.Changed, "#events-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.set_filter(event.value)

    @on(Input.Submitted, "#events-filter")
    def _filter_submitted(self) -> None:
        self._close_filter()

    @on(FilterInput.Cleared)
    def _filter_cleared(self) -> None:
        self._close_filter()  # the emptied field's Changed clears the filter

    def _close_filter(self) -> None:
        field = self.query_one("#events-filter", Input)
        field.display = False
        self.query_one("#events-log", RichLog).focus()
