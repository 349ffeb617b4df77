"""The base of every TUI screen: the pulse header, the screen's body, the prompt line and the keys footer,
and the keys that work on every screen.

A screen subclasses `BaseScreen`, yields its widgets from `compose_body()`, and implements
`refresh_from(fleet, applied)`: the app calls it with every change while the screen is shown, and with
`Applied(reset=True)` when the screen is shown again (so it redraws from `fleet` after a time away). Keep it
cheap: update what `applied` names (`applied.touches(kind)`), never rebuild a table on a delta.

Class attributes a screen sets:
- `HEADING`: its title (the frame title of its main widget);
- `FILTERABLE`: `/` opens a filter; the screen implements `apply_filter(text)` (and reads `filter_text`);
- `FLEET_ACTIONS`: names of its actions that change the fleet (drain, cordon...): left out of the footer
  when the app is read-only (ui.actions.request_action refuses them and says why);
- `BINDINGS`: its own keys; the ones with a description are listed in the footer and in the help;
- `HELP_EXTRA`: more (key, what) lines for the help only (keys too many for the footer).

Keys everywhere: `:` command (a screen's name or alias, `:fleet role:decode` switches and filters, `:q`
quits), `1`-`6` the screens, `/` filter, `?` help, `esc` back, `q` (or ctrl+c) quit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, cast

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen

from fleetctl.watch_state import Applied, FleetState
from ui import registry
from ui.widgets.command import CommandLine
from ui.widgets.footer import KeysFooter
from ui.widgets.header import PulseHeader

if TYPE_CHECKING:
    from ui.app import FleetApp

QUIT_COMMANDS = ("q", "q!", "quit", "exit")
RESET = Applied(reset=True)


def screen_keys(cls: type, hidden_actions: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(key, what it does) of the bindings `cls` declares with a description, its own before inherited
    ones; bindings whose action is in `hidden_actions` left out."""
    hidden = set(hidden_actions)
    keys: list[tuple[str, str]] = []
    seen: set[str] = set()
    for klass in cls.__mro__:
        for binding in vars(klass).get("BINDINGS", ()):
            if not isinstance(binding, Binding) or not binding.show or not binding.description:
                continue
            shown = binding.key_display or binding.key
            if shown in seen or binding.action.split("(")[0] in hidden:
                continue
            seen.add(shown)
            keys.append((shown, binding.description))
    return keys


def command_words() -> list[str]:
    """What the `:` prompt completes: every screen's name and aliases, and quit."""
    words = [word for entry in registry.entries() for word in (entry.name, *entry.aliases)]
    return [*words, "quit"]


class BaseScreen(Screen):
    HEADING: ClassVar[str] = ""
    FILTERABLE: ClassVar[bool] = False
    FLEET_ACTIONS: ClassVar[frozenset[str]] = frozenset()
    HELP_EXTRA: ClassVar[tuple[tuple[str, str], ...]] = ()

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("colon", "prompt(':')", "command", key_display=":"),
        Binding("slash", "prompt('/')", "filter", key_display="/"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("escape", "back", "back", key_display="esc"),
        Binding("q", "app.quit", "quit"),
        *(Binding(str(n), f"goto('{n}')", show=False) for n in range(1, 10)),
    ]

    def __init__(self, *, name: str | None = None) -> None:
        super().__init__(name=name)
        self.filter_text = ""

    # --- to implement ---

    def compose_body(self) -> ComposeResult:
        """The screen's own widgets, between the header and the prompt line."""
        yield from ()

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        """Show `applied`'s changes of `fleet` (everything when `applied.reset`)."""

    def apply_filter(self, text: str) -> None:
        """Filterable screens: show only what `text` matches (`filter_text` already holds it)."""

    # --- the frame ---

    @property
    def fleet_app(self) -> "FleetApp":
        return cast("FleetApp", self.app)

    def compose(self) -> ComposeResult:
        yield PulseHeader(id="pulse")
        yield from self.compose_body()
        yield CommandLine(command_words(), id="prompt")
        yield KeysFooter(id="keys")

    def on_screen_resume(self) -> None:
        self.refresh_chrome()
        self.refresh_from(self.fleet_app.fleet, RESET)

    def refresh_chrome(self) -> None:
        """The header and footer, from the app's state (the app calls it when the pulse or the connection
        changes, and when it learns it is read-only)."""
        if not self.is_mounted:
            return
        app = self.fleet_app
        self.query_one(PulseHeader).show(app.pulse_state())
        self.query_one(KeysFooter).show(self.footer_keys(), app.readonly_reason if app.readonly else None)

    def footer_keys(self) -> list[tuple[str, str]]:
        hidden = set(self.FLEET_ACTIONS) if self.fleet_app.readonly else set()
        keys = screen_keys(type(self), hidden)
        if not self.FILTERABLE:
            keys = [(key, what) for key, what in keys if key != "/"]
        return [*keys, (f"1-{len(registry.entries())}", "screens")]

    # --- keys everywhere ---

    def action_prompt(self, mode: str) -> None:
        if mode == "/" and not self.FILTERABLE:
            return
        self.query_one(CommandLine).open(mode, self.filter_text if mode == "/" else "")

    def action_goto(self, key: str) -> None:
        entry = registry.find(key)
        if entry is not None:
            self.fleet_app.show_screen(entry.name)

    def action_help(self) -> None:
        self.fleet_app.show_help()

    def action_back(self) -> None:
        self.fleet_app.go_back()

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        if self.is_mounted:
            self.apply_filter(self.filter_text)

    def on_command_line_entered(self, message: CommandLine.Entered) -> None:
        self._focus_body()
        if message.mode == "/":
            self.set_filter(message.text)
        else:
            self.run_command(message.text)

    def on_command_line_typed(self, message: CommandLine.Typed) -> None:
        if message.mode == "/":
            self.set_filter(message.text)

    def on_command_line_dismissed(self, message: CommandLine.Dismissed) -> None:
        self._focus_body()
        if message.mode == "/":  # esc: no filter (k9s)
            self.set_filter("")

    def run_command(self, text: str) -> None:
        """`:` + a screen's name, alias or number (then an optional filter for it), or q/quit."""
        name, _, rest = text.partition(" ")
        if not name:
            return
        if name.lower() in QUIT_COMMANDS:
            self.app.exit()
            return
        entry = registry.find(name)
        if entry is None:
            self.notify(f"no screen named {name!r} (try fleet, rollouts, quality, traffic, events)",
                        severity="warning", timeout=4)
            return
        self.fleet_app.show_screen(entry.name, filter_text=rest.strip() or None)

    def _focus_body(self) -> None:
        """Focus back on the screen's main widget after the prompt closes."""
        for widget in self.query("*"):
            if widget.focusable and not isinstance(widget, CommandLine) and widget.id != "prompt-input":
                widget.focus()
                return
