"""The modal for a model's new traffic weights: one field per class revision (every weighted or deployed
one, filled with its weight now). Checked before the confirmation: each must be a finite number >= 0 and
one at least above 0; a bad one is named ("chat@r2: 'ten' is not a number") and focused. Dismissed with
the weights to store, or None when cancelled.

The weights sent are the revisions above 0, plus those that had weight and now have 0 (so the command
says where traffic is taken from); a deployed revision left at 0 is not mentioned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

HINT = "relative weights, >= 0 · enter: check and confirm · esc: cancel"


class WeightsError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def parse_weight(ref: str, text: str) -> float:
    raw = text.strip()
    if not raw:
        raise WeightsError(ref, "give a weight (0 sends it nothing)")
    try:
        weight = float(raw)
    except ValueError:
        raise WeightsError(ref, f"{raw!r} is not a number") from None
    if not math.isfinite(weight) or weight < 0:
        raise WeightsError(ref, f"{raw!r}: a weight is a finite number >= 0")
    return weight


def parse_weights(texts: Mapping[str, str], current: Mapping[str, float]) -> dict[str, float]:
    """The weights to store from the fields' texts (ref -> text); WeightsError naming the first bad field."""
    parsed = {ref: parse_weight(ref, text) for ref, text in texts.items()}
    if not any(weight > 0 for weight in parsed.values()):
        raise WeightsError(next(iter(texts), "weights"), "give at least one revision a weight above 0")
    return {ref: weight for ref, weight in parsed.items() if weight > 0 or current.get(ref, 0) > 0}


class WeightsScreen(ModalScreen[dict[str, float] | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, model: str, current: Mapping[str, float]) -> None:
        super().__init__()
        self.model = model
        self.current = dict(current)
        self.refs = list(current)

    def compose(self) -> ComposeResult:
        with Vertical(id="weights-dialog"):
            yield Label(Text(f"New traffic weights for {self.model}", style="bold"), id="weights-title")
            with VerticalScroll(id="weights-rows"):
                for index, ref in enumerate(self.refs):
                    with Horizontal(classes="weights-row"):
                        yield Label(Text(ref), classes="weights-ref")
                        yield Input(f"{self.current[ref]:g}", id=f"weight-{index}", classes="weights-input",
                                    compact=True)
            yield Static(Text(HINT, style="dim"), id="weights-hint")
            with Horizontal(id="weights-buttons"):
                yield Button("OK", id="weights-ok", variant="primary")
                yield Button("Cancel", id="weights-cancel")

    def on_mount(self) -> None:
        if self.refs:
            self.query_one("#weight-0", Input).focus()

    def field(self, ref: str) -> Input:
        return self.query_one(f"#weight-{self.refs.index(ref)}", Input)

    @on(Input.Submitted)
    @on(Button.Pressed, "#weights-ok")
    def _submitted(self) -> None:
        self.action_confirm()

    @on(Button.Pressed, "#weights-cancel")
    def _cancel(self) -> None:
        self.action_cancel()

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        event.input.remove_class("invalid")

    def action_confirm(self) -> None:
        texts = {ref: self.field(ref).value for ref in self.refs}
        try:
            weights = parse_weights(texts, self.current)
        except WeightsError as exc:
            self._show_error(exc)
            return
        self.dismiss(weights)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _show_error(self, exc: WeightsError) -> None:
        hint = self.query_one("#weights-hint", Static)
        hint.update(Text(str(exc), style="bold"))
        hint.add_class("error")
        if exc.field in self.refs:
            field = self.field(exc.field)
            field.add_class("invalid")
            field.focus()
