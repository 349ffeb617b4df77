"""The Quality screen: the canary's verdicts as a grid (per model, a row named after it for its production
stream, then a row per class revision; a column per batch condition b1/b4/b8/b16, and `mixed` for
production), the evidence of the stream under the cursor (each test's statistic against its threshold, bad
of probes, the worst prompts, who is blamed), and the drills in effect with their time left.

A stream without a verdict reads "not measured", never blank and never green; a fleet without canary
data says "not measured" plainly, and why when it can tell (probes switched off).
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from fleetctl.controller.canary_responses import CanaryStreamView
from fleetctl.controller.responses import DrillView
from fleetctl.watch_state import Applied, FleetState
from ui.present import quality as present
from ui.screens.base import BaseScreen
from ui.widgets.table_sync import FitTable, set_columns, sync_rows

KINDS = ("canary_stream", "drill", "flag")
STREAM_COLUMN = "STREAM"
NARROW_BELOW = 110  # columns: below, "not measured" takes two lines so b1..mixed fit


class QualityScreen(BaseScreen):
    HEADING = "Quality"
    HELP_EXTRA = (("arrows", "move between streams: the evidence below follows"),)

    def __init__(self) -> None:
        super().__init__(name="quality")
        self._streams: Mapping[str, CanaryStreamView] = {}
        self._drills: Mapping[str, DrillView] = {}
        self._columns: list[str] = []
        self._rows: list[present.GridRow] = []
        self._narrow: bool | None = None  # "not measured" on two lines (the grid was built for that)

    def compose_body(self) -> ComposeResult:
        yield Static(Text(present.NOT_MEASURED, style="dim"), id="quality-empty")
        yield set_columns(FitTable(id="quality-grid", cursor_type="cell"), [STREAM_COLUMN, *present.columns(())])
        with VerticalScroll(id="quality-evidence-pane"):
            yield Static(id="quality-evidence")
        yield Static(id="quality-drills")

    def on_mount(self) -> None:
        self.query_one("#quality-grid", DataTable).focus()
        self.query_one("#quality-evidence-pane").border_title = "evidence"
        self.set_interval(1.0, self._tick, name="drill countdown")

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        if not any(applied.touches(kind) for kind in KINDS):
            return
        self._streams, self._drills = fleet.canary_streams(), fleet.drills()
        self._draw_grid(fleet)
        self._draw_drills()

    def _draw_grid(self, fleet: FleetState) -> None:
        table = self.query_one("#quality-grid", DataTable)
        empty = self.query_one("#quality-empty", Static)
        measured = bool(self._streams)
        table.display = self.query_one("#quality-evidence-pane").display = measured
        empty.display = not measured
        if not measured:
            self._columns, self._rows = [], []
            empty.update(present.no_data(fleet.flags()))
            return
        table.border_title = Text.assemble("Quality: ", present.summary(self._streams))
        self._columns, self._rows = present.grid(self._streams)
        narrow = self.size.width < NARROW_BELOW
        cursor = table.cursor_coordinate  # a rebuild (the width crossed NARROW_BELOW) must not move it
        set_columns(table, [STREAM_COLUMN, *self._columns], reset=narrow != self._narrow)
        rows = [(row.key, present.cells(row, self._columns, self._streams, narrow)) for row in self._rows]
        sync_rows(table, rows, rebuild=narrow != self._narrow, height=None)  # heights follow "not measured"
        if narrow != self._narrow and table.row_count:
            table.cursor_coordinate = table.validate_cursor_coordinate(cursor)
        self._narrow = narrow
        self._draw_evidence()

    def on_resize(self) -> None:
        if (self.size.width < NARROW_BELOW) != self._narrow and self._streams:
            self._draw_grid(self.fleet_app.fleet)

    def _tick(self) -> None:
        if any(drill.active for drill in self._drills.values()):
            self._draw_drills()

    def _draw_drills(self) -> None:
        lines = present.drill_lines(self._drills.values(), self.app.clock())
        drills = self.query_one("#quality-drills", Static)
        drills.display = bool(lines)
        drills.update(Text("\n").join(lines))

    def selected_stream(self) -> tuple[str | None, str]:
        """(the stream key under the cursor, how to name the cell when it has no stream)."""
        table = self.query_one("#quality-grid", DataTable)
        if not self._rows or table.row_count == 0:
            return None, ""
        row = self._rows[min(max(table.cursor_row, 0), len(self._rows) - 1)]
        index = table.cursor_column - 1
        column = self._columns[index] if 0 <= index < len(self._columns) else None
        where = f"{row.model} {row.revision}" + (f" {column}" if column else "")
        return present.stream_at(row, column), where

    def _draw_evidence(self) -> None:
        key, where = self.selected_stream()
        stream = self._streams.get(key) if key else None
        tz = self.app.clock().tzinfo
        self.query_one("#quality-evidence", Static).update(present.evidence(stream, where, tz) if where else "")

    def on_data_table_cell_highlighted(self, event: DataTable.CellHighlighted) -> None:
        if event.data_table.id == "quality-grid":
            self._draw_evidence()
