"""Table columns that fit the terminal: which columns a table shows at a width, and how wide each is.

A table declares its columns in display order, each with a minimum width, an optional maximum and a
priority (0: always shown; higher: dropped first when the terminal is narrow). `fit` keeps columns by
priority while they fit at their minimum widths, then gives the space left to the kept columns, in priority
order, up to each one's maximum (or the width its content needs). Pure, so a test can check 80 and 200
columns without a terminal.

    fit(COLUMNS, 78, wanted={"node": 9})  ->  [Fitted(NODE, 9), Fitted(ENGINE, 12), ...]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size

SEPARATOR = 1  # cells between two columns


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    min: int  # cells
    max: int | None = None  # None: fixed at `min`
    priority: int = 0  # 0: always shown; higher: dropped first when narrow
    right: bool = False  # right-justified (numbers)


@dataclass(frozen=True)
class Fitted:
    column: Column
    width: int


def fit(columns: Sequence[Column], width: int, wanted: Mapping[str, int] | None = None) -> list[Fitted]:
    """The columns shown in `width` cells and their widths, in display order. `wanted`: column key -> the
    width its content needs (a name column need not grow past its longest name)."""
    wanted = wanted or {}
    kept: set[str] = set()
    used = -SEPARATOR
    for column in sorted(columns, key=lambda c: c.priority):  # stable: display order within a priority
        if used + SEPARATOR + column.min <= width or not kept:
            kept.add(column.key)
            used += SEPARATOR + column.min
    widths = {c.key: c.min for c in columns if c.key in kept}
    left = max(0, width - used)
    for column in sorted((c for c in columns if c.key in kept), key=lambda c: c.priority):
        cap = column.max if column.max is not None else column.min
        cap = min(cap, max(column.min, wanted.get(column.key, cap)))
        grow = min(left, cap - widths[column.key])
        widths[column.key] += grow
        left -= grow
    return [Fitted(c, widths[c.key]) for c in columns if c.key in kept]


def cell(text: str, width: int, right: bool = False) -> str:
    """`text` in exactly `width` cells: cut with an ellipsis when longer, padded when shorter."""
    length = cell_len(text)
    if length > width:
        return set_cell_size(text, width - 1) + "…" if width > 1 else set_cell_size(text, width)
    pad = " " * (width - length)
    return pad + text if right else text + pad


def line(fitted: Sequence[Fitted], cells: Sequence[str]) -> str:
    """One table line: each cell fitted to its column, separated by SEPARATOR spaces."""
    return (" " * SEPARATOR).join(cell(text, f.width, f.column.right) for f, text in zip(fitted, cells))
