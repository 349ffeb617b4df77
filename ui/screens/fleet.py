"""The Fleet screen (home, `1`, `:fleet`): every engine with its node, one row each, and the nodes that run
no engine. Columns fit the terminal (at 80 columns: node, engine, role, class, state, running/waiting, KV,
TTFT; at 200 also drift, prefix-cache hit rate, ITL and restarts).

Keys: enter opens the engine's detail; `d` drains the engine, `D` its node, `c`/`u` cordon/uncordon its
node (through ui.actions: a confirmation first; refused when read-only; the engine detail cordons one
engine); `<`/`>` move the sort column, `!`
reverses it, shift+letter sorts by a column (N node, E engine, R role, C class, S state, Q queue, K KV,
H prefix hit, T TTFT, I ITL); `/` filters (ui/fleet_rows.py: plain text, or `role:decode state:failed`).
Row colours: failed or node down orangered, draining or cordoned mediumpurple, pending/starting darkorange, drifted
yellow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType

from fleetctl.watch_state import Applied, FleetState
from ui import actions
from ui.fleet_rows import COLUMNS, SORT_LETTERS, FleetRow, FleetRows
from ui.screens.base import BaseScreen
from ui.widgets.table import VirtualTable


class FleetScreen(BaseScreen):
    HEADING = "Fleet"
    FILTERABLE = True
    FLEET_ACTIONS = frozenset({"drain", "drain_node", "cordon", "uncordon"})

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "detail"),
        Binding("d", "drain", "drain"),
        Binding("D", "drain_node", "drain node"),
        Binding("c", "cordon", "cordon"),
        Binding("u", "uncordon", "uncordon"),
        Binding("less_than_sign", "sort_move(-1)", "sort", key_display="<>"),
        Binding("greater_than_sign", "sort_move(1)", show=False),
        Binding("exclamation_mark", "sort_reverse", "reverse", key_display="!"),
        *(Binding(letter, f"sort_by('{column}')", show=False) for letter, column in SORT_LETTERS.items()),
    ]

    HELP_EXTRA: ClassVar[tuple[tuple[str, str], ...]] = (
        ("shift+N E R C", "sort by node, engine, role, class (again: reversed)"),
        ("shift+S Q K H", "sort by state, queue, KV usage, prefix hit"),
        ("shift+T I", "sort by TTFT, ITL"),
    )

    def __init__(self) -> None:
        super().__init__(name="fleet")
        self.rows = FleetRows()

    @property
    def table(self) -> VirtualTable:
        return self.query_one("#fleet-table", VirtualTable)

    def compose_body(self) -> ComposeResult:
        yield VirtualTable(COLUMNS, self.rows, empty_text="waiting for the controller's first snapshot…",
                           id="fleet-table")

    def on_mount(self) -> None:
        self.table.set_sort(self.rows.sort_column, self.rows.reverse)
        self.table.focus()

    # --- following the fleet ---

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        if not (applied.reset or applied.touches("engine") or applied.touches("node")):
            return
        if self.rows.filter_text != self.filter_text:  # set before the screen was first shown
            self.rows.set_filter(self.filter_text)
        order_before = self.rows.order
        changed = self.rows.update(fleet, applied)
        table = self.table
        if self.rows.order is not order_before or applied.reset:
            table.set_order(self.rows.order)
        table.rows_changed(changed)
        self._update_title(fleet)

    def apply_filter(self, text: str) -> None:
        self.rows.set_filter(text)
        self.table.set_order(self.rows.order)
        self._update_title(self.fleet_app.fleet)

    def _update_title(self, fleet: FleetState) -> None:
        table = self.table
        nodes, engines = len(fleet.resources.get("node", {})), len(fleet.resources.get("engine", {}))
        sort = next(c.label for c in COLUMNS if c.key == self.rows.sort_column)
        title = f"Fleet: {nodes} nodes, {engines} engines · sort {sort}{'↓' if self.rows.reverse else '↑'}"
        shown, total = self.rows.counts()
        if self.rows.filter_text:
            title += f" · /{self.rows.filter_text} ({shown} of {total})"
        table.border_title = title
        if fleet.snapshots == 0:
            table.empty_text = "waiting for the controller's first snapshot…"
        elif self.rows.filter_text:
            table.empty_text = f"nothing matches /{self.rows.filter_text} (esc in the filter clears it)"
        else:
            table.empty_text = "no nodes or engines yet"

    # --- sorting ---

    def action_sort_by(self, column: str) -> None:
        reverse = not self.rows.reverse if column == self.rows.sort_column else False
        self._sort(column, reverse)

    def action_sort_move(self, step: int) -> None:
        shown = [f.column.key for f in self.table.fitted] or [c.key for c in COLUMNS]
        current = shown.index(self.rows.sort_column) if self.rows.sort_column in shown else 0
        self._sort(shown[(current + step) % len(shown)], False)

    def action_sort_reverse(self) -> None:
        self._sort(self.rows.sort_column, not self.rows.reverse)

    def _sort(self, column: str, reverse: bool) -> None:
        self.rows.set_sort(column, reverse)
        self.table.set_sort(column, reverse)
        self.table.set_order(self.rows.order)
        self._update_title(self.fleet_app.fleet)

    # --- the selected row ---

    def selected(self) -> FleetRow | None:
        key = self.table.cursor_key
        return None if key is None else self.rows.row(key)

    def on_virtual_table_selected(self, message: VirtualTable.Selected) -> None:
        message.stop()
        self.action_open()

    def action_open(self) -> None:
        row = self.selected()
        if row is not None and row.engine:
            self.fleet_app.open_engine(row.key)

    def action_drain(self) -> None:
        row = self.selected()
        if row is not None and row.engine:
            self._request(lambda: actions.drain_engine(row.node, row.engine))

    def action_drain_node(self) -> None:
        row = self.selected()
        if row is not None:
            self._request(lambda: actions.drain_node(row.node))

    def action_cordon(self) -> None:
        row = self.selected()
        if row is not None:
            self._request(lambda: actions.cordon_node(row.node))

    def action_uncordon(self) -> None:
        row = self.selected()
        if row is not None:
            self._request(lambda: actions.uncordon_node(row.node))

    def _request(self, build: Callable[[], actions.Action]) -> None:
        try:
            actions.request_action(self.app, build())
        except NotImplementedError:  # a build whose ui.actions is still the interface only
            self.notify("actions are not available in this build", severity="warning")
