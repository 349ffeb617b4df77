"""The Rollouts screen: every rollout the stream carries (the active ones first, then the finished ones,
dimmed) and the selected one in detail: A -> B, phase, its steps with the current one marked, the weights,
each gate's latest value against its threshold, the time left in a timed pause, counted down each second
with the app's clock, and its latest events (its transitions, and the operators' calls on it).

Keys act on the selected rollout, each through a confirmation (ui/actions.py): p pause, r resume,
P promote, F promote --full, a abort. A finished rollout takes none of them (said, not asked).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from fleetctl.controller.rollout.view import RolloutView
from fleetctl.watch_state import Applied, FleetState
from ui import actions
from ui.present import rollouts as present
from ui.present.timefmt import Countdowns
from ui.screens.base import BaseScreen
from ui.widgets.table_sync import FitTable, selected_key, set_columns, sync_rows

NO_ROLLOUTS = "no rollouts: start one with `fleetctl rollout start` (docs/rollouts.md)"


class RolloutsScreen(BaseScreen):
    HEADING = "Rollouts"
    FLEET_ACTIONS = frozenset({"pause", "resume", "promote", "promote_full", "abort"})
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "pause", "pause"),
        Binding("r", "resume", "resume"),
        Binding("P", "promote", "promote"),
        Binding("F", "promote_full", "promote --full"),
        Binding("a", "abort", "abort"),
    ]

    def __init__(self) -> None:
        super().__init__(name="rollouts")
        self._views: Mapping[str, RolloutView] = {}
        self._fleet: FleetState | None = None
        self._pauses = Countdowns()

    def compose_body(self) -> ComposeResult:
        yield set_columns(FitTable(id="rollouts-table", cursor_type="row"), present.COLUMNS)
        with VerticalScroll(id="rollout-detail-pane"):
            yield Static(Text(NO_ROLLOUTS, style="dim"), id="rollout-detail")

    def on_mount(self) -> None:
        self.query_one("#rollouts-table", DataTable).focus()
        self.query_one("#rollout-detail-pane").border_title = "detail"
        self._draw()
        self.set_interval(1.0, self._tick, name="pause countdown")

    # --- state in ---

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        if not (applied.touches("rollout") or any(e.subject.startswith("rollouts/") for e in applied.events)):
            return
        now = self.app.clock()
        self._fleet = fleet
        self._views = fleet.rollouts()
        for key, view in self._views.items():
            self._pauses.observe(key, view.pause_left_s, now)
        self._pauses.keep_only(self._views)
        self._draw()

    def _tick(self) -> None:
        if any(view.pause_left_s is not None for view in self._views.values()):
            self._draw()

    def _left(self) -> dict[str, float | None]:
        now = self.app.clock()
        return {key: self._pauses.left(key, now) for key in self._views}

    def _draw(self) -> None:
        table = self.query_one("#rollouts-table", DataTable)
        left = self._left()
        sync_rows(table, present.rows(self._views.values(), left))
        active = sum(1 for view in self._views.values() if present.is_active(view))
        table.border_title = f"Rollouts: {active} active, {len(self._views) - active} finished"
        self._draw_detail(left)

    def _draw_detail(self, left: Mapping[str, float | None]) -> None:
        detail = self.query_one("#rollout-detail", Static)
        view = self.selected()
        if view is None:
            detail.update(Text(NO_ROLLOUTS, style="dim"))
        else:
            events = present.events_of(view, self._fleet.events if self._fleet else ())
            detail.update(present.detail(view, left.get(str(view.id)), events))
        self.query_one("#rollout-detail-pane").border_title = present.title(view) if view else "detail"

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "rollouts-table":
            self._draw_detail(self._left())

    def selected(self) -> RolloutView | None:
        key = selected_key(self.query_one("#rollouts-table", DataTable))
        return self._views.get(key) if key is not None else None

    # --- actions ---

    def _act(self, verb: str, make: Callable[[RolloutView], actions.Action]) -> None:
        view = self.selected()
        if view is None:
            self.app.notify("no rollout selected", severity="warning")
        elif not present.is_active(view):
            self.app.notify(f"rollout {view.id} is {view.phase}: nothing to {verb}", severity="warning")
        else:
            actions.request_action(self.app, make(view))

    def action_pause(self) -> None:
        self._act("pause", lambda v: actions.pause_rollout(v.model, v.id))

    def action_resume(self) -> None:
        self._act("resume", lambda v: actions.resume_rollout(v.model, v.id))

    def action_promote(self) -> None:
        self._act("promote", lambda v: actions.promote_rollout(v.model, v.id))

    def action_promote_full(self) -> None:
        self._act("promote", lambda v: actions.promote_rollout(v.model, v.id, full=True))

    def action_abort(self) -> None:
        self._act("abort", lambda v: actions.abort_rollout(v.model, v.id))
