"""Keeping a DataTable in step with rows computed afresh: cells that changed are updated in place (the
cursor and scroll stay); when rows come, go or move, the table is rebuilt and the cursor put back on the
row it was on. For the small tables of the Rollouts, Quality and Traffic screens (tens of rows)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import events
from textual.coordinate import Coordinate
from textual.widgets import DataTable

Row = tuple[str, Sequence[Text | str]]


class FitTable(DataTable):
    """A DataTable whose `height: auto` follows its rows: DataTable measures new rows when idle, after the
    layout that sized it, so it asks for another layout (after the next refresh: one asked for inside the
    idle handler is lost) when its virtual size changed."""

    async def _on_idle(self, event: events.Idle) -> None:
        before = self.virtual_size
        await super()._on_idle(event)
        if self.virtual_size != before:
            self.call_after_refresh(self.refresh, layout=True)


def selected_key(table: DataTable) -> str | None:
    """The key of the row under the cursor, None in an empty table."""
    if table.row_count == 0:
        return None
    row = min(max(table.cursor_row, 0), table.row_count - 1)
    key = table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value
    return str(key) if key is not None else None


def row_keys(table: DataTable) -> list[str]:
    return [str(row.key.value) for row in table.ordered_rows]


def sync_rows(table: DataTable, rows: Sequence[Row], *, rebuild: bool = False, height: int | None = 1) -> bool:
    """Make `table` show `rows` (key, cells) in order; True when it was rebuilt (always, with `rebuild`: a
    row's height is set when it is added). `height`: of each row added (None: as tall as its cells)."""
    keys = [key for key, _ in rows]
    if row_keys(table) == keys and not rebuild:
        columns = list(table.columns)
        for key, cells in rows:
            for column, cell in zip(columns, cells):
                if table.get_cell(key, column) != cell:
                    table.update_cell(key, column, cell)
        return False
    selected, cursor_column = selected_key(table), table.cursor_column
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key, height=height)
    if keys:
        row = keys.index(selected) if selected in keys else 0
        table.move_cursor(row=row, column=cursor_column, animate=False)
    table.refresh(layout=True)  # an auto-height table keeps its old height otherwise
    return True


def set_columns(table: DataTable, labels: Sequence[str], *, reset: bool = False) -> DataTable:
    """Give `table` these columns, keyed by their labels (clearing its rows when they change, or to `reset`
    their widths: a column keeps the width of the widest cell it ever held); the table."""
    if reset or [str(column.key.value) for column in table.columns.values()] != list(labels):
        table.clear(columns=True)
        for label in labels:
            table.add_column(label, key=label)
        table.refresh(layout=True)
    return table
