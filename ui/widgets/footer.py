"""The footer: the current screen's keys (k9s style, `<key> what`), and "read-only (REASON)" when the app
may not change the fleet (then the keys that would are not listed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.widget import Widget


class KeysFooter(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"keys--key", "keys--readonly"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.keys: tuple[tuple[str, str], ...] = ()
        self.readonly_reason: str | None = None

    def show(self, keys: Sequence[tuple[str, str]], readonly_reason: str | None) -> None:
        self.keys, self.readonly_reason = tuple(keys), readonly_reason
        self.refresh()

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        if self.readonly_reason:
            text.append(f"read-only ({self.readonly_reason})", self.get_component_rich_style("keys--readonly", partial=True))
            text.append("  ")
        key_style = self.get_component_rich_style("keys--key", partial=True)
        for index, (key, description) in enumerate(self.keys):
            if index:
                text.append(" ")
            text.append(f"<{key}>", key_style)
            text.append(description)
        return text
