"""The footer: the current screen's keys (`d drain  D drain node ...`, then the keys every screen has), and
"read-only (REASON)" first when the app may not change the fleet (then the keys that would are not listed).
It wraps to a second line rather than hide keys on a narrow terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual.widget import Widget

SEPARATOR = "  "


def pack_keys(items: Sequence[tuple[str, str]], width: int) -> list[list[tuple[str, str]]]:
    """Key hints in lines of at most `width` cells, never split."""
    lines: list[list[tuple[str, str]]] = [[]]
    used = 0
    for key, what in items:
        size = cell_len(key) + 1 + cell_len(what)
        if lines[-1] and used + len(SEPARATOR) + size > width:
            lines.append([])
            used = 0
        used += size + (len(SEPARATOR) if len(lines[-1]) else 0)
        lines[-1].append((key, what))
    return lines


class KeysFooter(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"keys--key", "keys--readonly"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.keys: tuple[tuple[str, str], ...] = ()
        self.readonly_reason: str | None = None

    def show(self, keys: Sequence[tuple[str, str]], readonly_reason: str | None) -> None:
        self.keys, self.readonly_reason = tuple(keys), readonly_reason
        self.refresh(layout=True)

    def _items(self) -> list[tuple[str, str]]:
        head = [("read-only", f"({self.readonly_reason})")] if self.readonly_reason else []
        return head + list(self.keys)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return len(pack_keys(self._items(), width))

    def render(self) -> Text:
        key_style = self.get_component_rich_style("keys--key", partial=True)
        readonly_style = self.get_component_rich_style("keys--readonly", partial=True)
        text = Text(no_wrap=True, overflow="ellipsis")
        for number, line in enumerate(pack_keys(self._items(), self.size.width)):
            if number:
                text.append("\n")
            for index, (key, what) in enumerate(line):
                if index:
                    text.append(SEPARATOR)
                readonly = self.readonly_reason is not None and number == 0 and index == 0
                text.append(key, readonly_style if readonly else key_style)
                text.append(f" {what}", readonly_style if readonly else None)
        return text
