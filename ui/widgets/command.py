"""The prompt line at the bottom of a screen (k9s style): `:` takes a command, `/` a filter.

Hidden until a screen opens it with `open(mode, text)`. It posts, and the screen reacts:
- `CommandLine.Entered(mode, text)` on enter (and closes);
- `CommandLine.Typed(mode, text)` on every edit (a filter applies as it is typed);
- `CommandLine.Dismissed(mode)` on esc (and closes).
In `:` mode it completes screen names and aliases (right arrow accepts the suggestion).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widgets import Input, Static

PLACEHOLDERS = {":": "screen name or alias (fleet, rollouts, quality, traffic, events), q to quit",
                "/": "filter: text, or node: engine: model: role: class: state: terms; !term excludes"}


class CommandLine(Horizontal):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss", "close", show=False)]

    @dataclass
    class Entered(Message):
        mode: str
        text: str

    @dataclass
    class Typed(Message):
        mode: str
        text: str

    @dataclass
    class Dismissed(Message):
        mode: str

    def __init__(self, commands: Sequence[str] = (), *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.mode = ":"
        self._suggester = SuggestFromList(list(commands), case_sensitive=False)

    def compose(self) -> ComposeResult:
        yield Static(":", id="prompt-mode")
        yield Input(id="prompt-input", compact=True, select_on_focus=False)

    @property
    def input(self) -> Input:
        return self.query_one("#prompt-input", Input)

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def open(self, mode: str, text: str = "") -> None:
        self.mode = mode
        self.query_one("#prompt-mode", Static).update(mode)
        field = self.input
        field.suggester = self._suggester if mode == ":" else None
        field.placeholder = PLACEHOLDERS.get(mode, "")
        with field.prevent(Input.Changed):
            field.value = text
        field.cursor_position = len(text)
        self.add_class("-open")
        field.focus()

    def close(self) -> None:
        self.remove_class("-open")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.close()
        self.post_message(self.Entered(self.mode, event.value.strip()))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.is_open:
            self.post_message(self.Typed(self.mode, event.value))

    def action_dismiss(self) -> None:
        self.close()
        self.post_message(self.Dismissed(self.mode))
