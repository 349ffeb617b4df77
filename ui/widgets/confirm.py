"""The confirmation of an action: its title, the exact equivalent `fleetctl` command (with the reason as it
is typed), a reason field, OK / Cancel. A reason is required: it goes to the audit log, as the CLI's
--reason does, so OK (or enter) with an empty one does nothing but say so. Enter confirms, esc cancels.
Dismissed with the reason, or None when cancelled.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ui.actions import Action

REASON_REQUIRED = "a reason is required: it is recorded in the audit log"
HINT = "enter: confirm · esc: cancel"


class ConfirmScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, action: Action) -> None:
        super().__init__(classes="destructive" if action.destructive else "")
        self.confirming = action

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog"):
            yield Label(Text(self.confirming.title, style="bold"), id="confirm-title")
            yield Static(self._command_text(""), id="confirm-command")
            yield Input(placeholder="reason (required; recorded in the audit log)", id="confirm-reason")
            yield Static(Text(HINT, style="dim"), id="confirm-hint")
            with Horizontal(id="confirm-buttons"):
                yield Button("OK", id="confirm-ok", variant="error" if self.confirming.destructive
                             else "primary")
                yield Button("Cancel", id="confirm-cancel")

    def on_mount(self) -> None:
        self.query_one("#confirm-reason", Input).focus()

    def _command_text(self, reason: str) -> Text:
        return Text.assemble(("$ ", "dim"), self.confirming.command_for(reason))

    @on(Input.Changed, "#confirm-reason")
    def _reason_changed(self, event: Input.Changed) -> None:
        self.query_one("#confirm-command", Static).update(self._command_text(event.value))
        if event.value.strip():
            self._hint(HINT, error=False)

    @on(Input.Submitted, "#confirm-reason")
    def _reason_submitted(self) -> None:
        self.action_confirm()

    @on(Button.Pressed, "#confirm-ok")
    def _ok(self) -> None:
        self.action_confirm()

    @on(Button.Pressed, "#confirm-cancel")
    def _cancel(self) -> None:
        self.action_cancel()

    def action_confirm(self) -> None:
        reason = self.query_one("#confirm-reason", Input).value.strip()
        if not reason:
            self._hint(REASON_REQUIRED, error=True)
            self.query_one("#confirm-reason", Input).focus()
            return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _hint(self, text: str, *, error: bool) -> None:
        hint = self.query_one("#confirm-hint", Static)
        hint.update(Text(text, style="bold" if error else "dim"))
        hint.set_class(error, "error")
