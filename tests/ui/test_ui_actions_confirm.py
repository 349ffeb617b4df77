"""Each action's equivalent command (every one parsed by the real `fleetctl` CLI), the confirmation that shows
it (updating as the reason is typed), the required reason, esc, and read-only apps refusing every action
without a modal. No controller is needed: nothing here is confirmed against one (test_ui_actions_controller.py
does that)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from rich.text import Text
from textual.widgets import Input, Static
from typer.testing import CliRunner
from uiscreens_data import MODEL, FrozenClock, Script, snapshot

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app as cli
from ui import actions
from ui.app import make_app
from ui.messages import ActionDone
from ui.widgets.confirm import REASON_REQUIRED, ConfirmScreen

UNREACHABLE = "http://127.0.0.1:9"

EVERY_ACTION: list[tuple[actions.Action, str]] = [
    (actions.drain_node("n1"), "fleetctl node drain n1 --no-wait --yes --reason '<reason>'"),
    (actions.cordon_node("n1"), "fleetctl node cordon n1 --yes --reason '<reason>'"),
    (actions.uncordon_node("n1"), "fleetctl node uncordon n1 --reason '<reason>'"),
    (actions.drain_engine("n1", "chat-0"), "fleetctl engine drain chat-0 --no-wait --yes --reason '<reason>'"),
    (actions.pause_rollout(MODEL, 7), "fleetctl rollout pause 7 --reason '<reason>'"),
    (actions.resume_rollout(MODEL, 7), "fleetctl rollout resume 7 --reason '<reason>'"),
    (actions.promote_rollout(MODEL, 7), "fleetctl rollout promote 7 --reason '<reason>'"),
    (actions.promote_rollout(MODEL, 7, full=True), "fleetctl rollout promote 7 --full --reason '<reason>'"),
    (actions.abort_rollout(MODEL, 7), "fleetctl rollout abort 7 --reason '<reason>'"),
    (actions.set_weights(MODEL, {"chat@r1": 90, "chat@r2": 10.5}),
     f"fleetctl traffic set {MODEL} chat@r1=90 chat@r2=10.5 --no-wait --reason '<reason>'"),
]
IDS = [a.title for a, _ in EVERY_ACTION]


@pytest.mark.parametrize(("action", "command"), EVERY_ACTION, ids=IDS)
def test_each_action_names_its_exact_command(action: actions.Action, command: str) -> None:
    assert action.command == command
    assert action.command_for("it's late; rm -rf /") == command.replace(
        "'<reason>'", shlex.quote("it's late; rm -rf /"))
    assert action.command_for("  ") == command


@pytest.mark.parametrize(("action", "command"), EVERY_ACTION, ids=IDS)
def test_the_cli_takes_each_command_as_written(action: actions.Action, command: str) -> None:
    """Parsed by the real CLI (an unknown option or argument is exit 2): with nothing listening, each gets as
    far as calling the controller (exit 6)."""
    words = shlex.split(action.command_for("why not"))
    assert words[0] == "fleetctl"
    result = CliRunner().invoke(cli, ["--controller", UNREACHABLE, "--token", "t" * 20, *words[1:]])
    assert result.exit_code == ExitCode.UNAVAILABLE, (command, result.output)


def text_of(widget: Any) -> str:
    content = widget.content
    return content.plain if isinstance(content, Text) else str(content)


def quiet_app(readonly: bool = False) -> Any:
    return make_app(UNREACHABLE, None, readonly, source=Script(snapshot()), clock=FrozenClock())


@pytest.mark.parametrize(("action", "command"), EVERY_ACTION, ids=IDS)
async def test_the_confirmation_shows_the_command_as_the_reason_is_typed(action: actions.Action, command: str) -> None:
    app = quiet_app()
    async with app.run_test(size=(120, 30)) as pilot:
        actions.request_action(app, action)
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert text_of(app.screen.query_one("#confirm-title")) == action.title
        assert text_of(app.screen.query_one("#confirm-command", Static)) == f"$ {command}"
        await pilot.press(*"disk full")
        await pilot.pause()
        assert text_of(app.screen.query_one("#confirm-command", Static)) == \
            "$ " + command.replace("'<reason>'", "'disk full'")


async def test_an_empty_reason_does_not_confirm_and_says_why() -> None:
    app = quiet_app()
    results: list[str | None] = []
    async with app.run_test(size=(120, 30)) as pilot:
        app.push_screen(ConfirmScreen(actions.cordon_node("n1")), results.append)
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and results == []
        assert text_of(app.screen.query_one("#confirm-hint", Static)) == REASON_REQUIRED
        await pilot.press(*"   ", "tab", "enter")  # spaces only, then OK
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and results == []
        app.screen.query_one("#confirm-reason", Input).value = "rack swap"
        await pilot.press("tab", "tab", "enter")  # to Cancel: cancels even with a reason
        await pilot.pause()
        assert results == [None] and not isinstance(app.screen, ConfirmScreen)


async def test_enter_confirms_with_the_reason_and_esc_cancels() -> None:
    app = quiet_app()
    results: list[str | None] = []
    async with app.run_test(size=(120, 30)) as pilot:
        app.push_screen(ConfirmScreen(actions.abort_rollout(MODEL, 7)), results.append)
        await pilot.pause()
        await pilot.press(*"  latency regression ", "enter")
        await pilot.pause()
        app.push_screen(ConfirmScreen(actions.abort_rollout(MODEL, 7)), results.append)
        await pilot.pause()
        await pilot.press(*"never mind", "escape")
        await pilot.pause()
        assert results == ["latency regression", None]


class Recorder:
    def __init__(self) -> None:
        self.done: list[ActionDone] = []

    def __call__(self, message: Any) -> None:
        if isinstance(message, ActionDone):
            self.done.append(message)


async def test_a_read_only_app_refuses_every_action_without_a_modal() -> None:
    app = quiet_app(readonly=True)
    hook = Recorder()
    async with app.run_test(size=(120, 30), message_hook=hook) as pilot:
        await pilot.pause()
        for action, _ in EVERY_ACTION:
            actions.request_action(app, action)
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen), action.title
        notes = [n.message for n in app._notifications]
        assert notes == ["read-only: --readonly"] * len(EVERY_ACTION)
        assert [(d.ok, d.detail) for d in hook.done] == [(False, "read-only: --readonly")] * len(EVERY_ACTION)


async def test_read_only_keys_on_the_screens_show_no_modal() -> None:
    app = quiet_app(readonly=True)
    async with app.run_test(size=(120, 30)) as pilot:
        for screen_key, keys in (("2", "prPFa"), ("4", "w")):
            await pilot.press(screen_key)
            await pilot.pause()
            for key in keys:
                await pilot.press(key)
                await pilot.pause()
                assert type(app.screen).__name__ not in ("ConfirmScreen", "WeightsScreen"), key
        assert len([n for n in app._notifications if n.message == "read-only: --readonly"]) == 6
