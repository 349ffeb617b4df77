"""The help screen (`?`): every screen's keys, the keys that work everywhere, and what the row colours mean.
Closed with esc, `?` or `q`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

Section = tuple[str, Sequence[tuple[str, str]]]  # (title, [(key, what it does)])

LEGEND: tuple[tuple[str, str, str], ...] = (
    ("error", "failed, or its node is down", "help--error"),
    ("draining", "draining (the engine, or its node)", "help--draining"),
    ("pending", "pending or starting", "help--pending"),
    ("drifted", "runs a config that differs from its class revision", "help--drifted"),
    ("stopped", "stopped", "help--stopped"),
)


class HelpScreen(ModalScreen[None]):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"help--title", "help--key", *(c for _, _, c in LEGEND)}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "close", key_display="esc"),
    ]

    def __init__(self, sections: Sequence[Section], notes: Sequence[str] = ()) -> None:
        super().__init__()
        self.sections = tuple(sections)
        self.notes = tuple(notes)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(id="help-text")

    def on_mount(self) -> None:  # component styles are known once mounted
        self.query_one("#help-text", Static).update(self._text())

    def _text(self) -> Text:
        title = self.get_component_rich_style("help--title", partial=True)
        key_style = self.get_component_rich_style("help--key", partial=True)
        text = Text()
        for title_text, keys in self.sections:
            text.append(f"{title_text}\n", title)
            for key, what in keys:
                text.append(f"  {key:<15} ", key_style)
                text.append(f"{what}\n")
            text.append("\n")
        text.append("Row colours\n", title)
        for name, what, component in LEGEND:
            text.append(f"  {name:<15} ", self.get_component_rich_style(component, partial=True))
            text.append(f"{what}\n")
        for note in self.notes:
            text.append(f"\n{note}")
        return text
