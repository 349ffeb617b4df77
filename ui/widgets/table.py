"""A virtual table: renders only the rows on screen, from a row provider, with a row cursor.

Why not DataTable: a live fleet of 4,000 engines whose metrics change every second, sorted by a metric and
filtered as the operator types. DataTable stores every cell, re-measures rows, and removes a row in O(rows),
so a filter over thousands of rows is quadratic. Here the table holds only the order of the row keys; the
provider (e.g. ui/fleet_rows.FleetRows) holds the data and renders one row's cells on demand. A change
invalidates the changed keys' cached lines; a repaint renders the visible lines only (cached), so the cost of
a delta is independent of the fleet's size.

Columns fit the width (ui/columns.fit): an 80-column terminal drops the low-priority ones. The first line
is the column header (with the sort column marked); `tone`s of rows map to the component classes
`vtable--TONE` (colours in ui/fleet.tcss). Keys: up/down (j/k), pageup/pagedown, home/end (g/G), enter.
The cursor stays on its row's key when the rows reorder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar, Protocol

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ui.columns import Column, Fitted, fit, line

TONES = ("error", "draining", "pending", "drifted", "stopped")
CACHE_LIMIT = 2000  # rendered lines kept; far above any screen's height


class RowProvider(Protocol):
    def cells(self, key: str, fitted: Sequence[Fitted]) -> tuple[list[str], str]:
        """A row's cell texts for `fitted`, and its tone ("" for none)."""
        ...

    def wanted_widths(self) -> Mapping[str, int]:
        """Column key -> the width its content needs (for the flexible columns)."""
        ...


class VirtualTable(ScrollView, can_focus=True):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"vtable--header", "vtable--cursor", "vtable--empty",
                                             *(f"vtable--{tone}" for tone in TONES)}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "cursor(-1)", "up", show=False),
        Binding("down,j", "cursor(1)", "down", show=False),
        Binding("pageup,ctrl+b", "page(-1)", "page up", show=False),
        Binding("pagedown,ctrl+f", "page(1)", "page down", show=False),
        Binding("home,g", "first", "first", show=False),
        Binding("end,G", "last", "last", show=False),
        Binding("enter", "select", "open", show=False),
    ]

    class Selected(Message):
        """enter (or a click on the cursor row) on the row `key`."""

        def __init__(self, table: "VirtualTable", key: str) -> None:
            super().__init__()
            self.table, self.key = table, key

        @property
        def control(self) -> "VirtualTable":
            return self.table

    def __init__(self, columns: Sequence[Column], provider: RowProvider, *, empty_text: str = "no rows",
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.columns = tuple(columns)
        self.provider = provider
        self.empty_text = empty_text
        self.sort_column: str | None = None
        self.reverse = False
        self._keys: list[str] = []
        self._index: dict[str, int] = {}
        self._cursor = 0
        self._fitted: list[Fitted] = []
        self._lines: dict[str, Strip] = {}
        self._styles: dict[str, Style] = {}

    # --- what the screen tells it ---

    @property
    def keys(self) -> list[str]:
        return self._keys

    @property
    def fitted(self) -> list[Fitted]:
        return self._fitted

    def set_order(self, keys: list[str]) -> None:
        """The rows shown, in order. The cursor follows its key (or keeps its place when the key is gone)."""
        current = self.cursor_key
        self._keys = keys
        self._index = {key: index for index, key in enumerate(keys)}
        if current is not None and current in self._index:
            self._cursor = self._index[current]
        self._cursor = max(0, min(self._cursor, len(keys) - 1))
        self.virtual_size = Size(self.size.width, len(keys) + 1)
        self._scroll_to_cursor()
        self.refresh()

    def rows_changed(self, keys: Iterable[str] | None = None) -> None:
        """Rows whose cells changed (None: all of them, and the columns refit to their content)."""
        if keys is None:
            self._lines.clear()
            self._fit()
        else:
            for key in keys:
                self._lines.pop(key, None)
        self.refresh()

    def set_sort(self, column: str | None, reverse: bool) -> None:
        self.sort_column, self.reverse = column, reverse
        self.refresh()

    @property
    def cursor_key(self) -> str | None:
        return self._keys[self._cursor] if 0 <= self._cursor < len(self._keys) else None

    @property
    def cursor_row(self) -> int:
        return self._cursor

    def move_to(self, key: str) -> None:
        if key in self._index:
            self._set_cursor(self._index[key])

    # --- keys and mouse ---

    def action_cursor(self, delta: int) -> None:
        self._set_cursor(self._cursor + delta)

    def action_page(self, direction: int) -> None:
        self._set_cursor(self._cursor + direction * max(1, self.size.height - 2))

    def action_first(self) -> None:
        self._set_cursor(0)

    def action_last(self) -> None:
        self._set_cursor(len(self._keys) - 1)

    def action_select(self) -> None:
        if self.cursor_key is not None:
            self.post_message(self.Selected(self, self.cursor_key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < 1:
            return
        index = int(self.scroll_y) + offset.y - 1
        if index < len(self._keys):
            if index == self._cursor:
                self.action_select()
            self._set_cursor(index)

    def _set_cursor(self, index: int) -> None:
        index = max(0, min(index, len(self._keys) - 1))
        if index != self._cursor:
            self._cursor = index
            self._scroll_to_cursor()
            self.refresh()

    def _scroll_to_cursor(self) -> None:
        body = max(1, self.size.height - 1)
        top = int(self.scroll_y)
        if self._cursor < top:
            self.scroll_to(y=self._cursor, animate=False)
        elif self._cursor >= top + body:
            self.scroll_to(y=self._cursor - body + 1, animate=False)

    # --- rendering ---

    def on_resize(self, _event: events.Resize) -> None:
        self._lines.clear()
        self._fit()
        self.virtual_size = Size(self.size.width, len(self._keys) + 1)
        self._scroll_to_cursor()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._lines.clear()

    def _fit(self) -> None:
        self._fitted = fit(self.columns, self.size.width, self.provider.wanted_widths())

    def _component(self, name: str) -> Style:
        """What component `name` adds over the widget's style, blended with the background first (a theme
        colour with alpha, `$primary 45%`, must not read as the solid colour): a tone adds its colour, the
        cursor its background, the header and the empty line their whole style."""
        style = self._styles.get(f"component:{name}")
        if style is None:
            full = self.get_component_rich_style(f"vtable--{name}")
            if name == "cursor":
                style = Style(bgcolor=full.bgcolor, bold=full.bold)
            elif name in TONES:
                style = Style(color=full.color)
            else:
                style = full
            self._styles[f"component:{name}"] = style
        return style

    def _style(self, name: str) -> Style:
        """The widget's style with component `name` over it ("" for none)."""
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.rich_style + (self._component(name) if name else Style())
        return style

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            return self._header(width)
        index = int(self.scroll_y) + y - 1
        if not self._keys and y == 1:
            return self._text_line(self.empty_text, self._style("empty"), width)
        if index >= len(self._keys):
            return Strip.blank(width, self._style(""))
        key = self._keys[index]
        if index == self._cursor:  # not cached: the cursor moves
            cells, tone = self.provider.cells(key, self._fitted)
            return self._text_line(line(self._fitted, cells), self._style(tone) + self._component("cursor"), width)
        strip = self._lines.get(key)
        if strip is None or strip.cell_length != width:
            if len(self._lines) > CACHE_LIMIT:
                self._lines.clear()
            cells, tone = self.provider.cells(key, self._fitted)
            strip = self._lines[key] = self._text_line(line(self._fitted, cells), self._style(tone), width)
        return strip

    def _header(self, width: int) -> Strip:
        labels = []
        for fitted in self._fitted:
            label = fitted.column.label
            if fitted.column.key == self.sort_column:
                label += "↓" if self.reverse else "↑"
            labels.append(label)
        return self._text_line(line(self._fitted, labels), self._style("header"), width)

    @staticmethod
    def _text_line(text: str, style: Style, width: int) -> Strip:
        return Strip([Segment(text, style)], cell_len(text)).adjust_cell_length(width, style)
