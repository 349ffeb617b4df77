"""The TUI's actions against a real controller on loopback (tests/ui/uiscreens_fleet.py): confirmed from
the screens' keys, each makes its change (read back through the API) and is audited with the reason typed,
exactly as its equivalent `fleetctl` command is (the same route, target, reason and body); cancelled, each
makes none (state and audit log unchanged); a refusal is one line; a viewer token refuses every action
without a modal."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual import events
from typer.testing import CliRunner
from uiscreens_data import FrozenClock, Script
from uiscreens_fleet import (
    MODEL,
    Controller,
    agent,
    audit_of,
    controller,
    register,
    serve_chat,
    snapshot_of,
    wait_for,
    wait_until,
)

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app as cli
from fleetctl.cli.rollout_cmd import spec_from_flags
from ui import actions
from ui.app import make_app
from ui.messages import ActionDone
from ui.widgets.confirm import ConfirmScreen
from ui.widgets.weights import WeightsScreen

SIZE = (160, 50)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Controller]:
    with controller(tmp_path) as ctl, agent(ctl, "n1", engines=8):
        serve_chat(ctl)
        yield ctl


class Done:
    """Collects ActionDone messages (the app's message hook)."""

    def __init__(self) -> None:
        self.messages: list[ActionDone] = []

    def __call__(self, message: Any) -> None:
        if isinstance(message, ActionDone):
            self.messages.append(message)

    async def next(self, count: int) -> ActionDone:
        await wait_until(lambda: len(self.messages) >= count)
        return self.messages[count - 1]


def app_for(ctl: Controller, script: Script, role: str = "operator", readonly: bool = False) -> Any:
    return make_app(ctl.url, ctl.tokens[role], readonly, source=script, client=ctl.async_client(role),
                    clock=FrozenClock())


async def paste(pilot: Any, text: str) -> None:
    """Paste `text` into the focused input. Typing it key by key is tested with the modal alone
    (test_ui_actions_confirm.py); here each key would wait for the process to go idle, which the controller
    and the agent running in this process rarely let it (0.2-0.3 s a key)."""
    pilot.app.focused.post_message(events.Paste(text))
    await pilot.pause()


async def confirm(pilot: Any, keys: str, reason: str) -> str:
    """Press the action's key(s), check the confirmation is up, type the reason, confirm; the command shown."""
    await pilot.press(*keys)
    await pilot.pause()
    assert isinstance(pilot.app.screen, ConfirmScreen)
    await paste(pilot, reason)
    shown = pilot.app.screen.query_one("#confirm-command").content.plain
    await pilot.press("enter")
    return shown.removeprefix("$ ")


async def cancel(pilot: Any, keys: str) -> None:
    await pilot.press(*keys)
    await pilot.pause()
    assert isinstance(pilot.app.screen, ConfirmScreen)
    await paste(pilot, "not now")
    await pilot.press("escape")
    await pilot.pause()
    assert not isinstance(pilot.app.screen, ConfirmScreen)


def same_as_cli(ctl: Controller, command: str, actor: str) -> None:
    """Run `command` with the CLI; its audit record matches the TUI's, made just before: the same route, reason
    and body (and target, when both had the same outcome: the same call again may be a no-op or refused
    now, and a refusal is recorded under its path)."""
    tui = audit_of(ctl, actor)[-1]
    result = CliRunner().invoke(cli, ["--controller", ctl.url, "--token", ctl.tokens["operator"],
                                      *shlex.split(command)[1:]])
    assert result.exit_code != ExitCode.USAGE, result.output
    by_cli = audit_of(ctl, actor)[-1]
    assert by_cli.id > tui.id
    assert (by_cli.action, by_cli.reason, by_cli.payload_digest) == (tui.action, tui.reason, tui.payload_digest)
    if by_cli.result == tui.result:
        assert by_cli.target == tui.target


def rollout_phase(ctl: Controller, rollout_id: int) -> Any:
    with ctl.client("viewer") as api:
        return api.get_rollout(rollout_id)


def start_paused_rollout(ctl: Controller, rollout_id: int, undo_of: int | None = None) -> None:
    with ctl.client("operator") as api:
        if undo_of is None:
            api.start_rollout(spec_from_flags(MODEL, "chat@r2", [50], "1h"), reason="try r2")
        else:
            api.rollout_command(undo_of, "undo", reason="back again")
    wait_for(lambda: rollout_phase(ctl, rollout_id).phase == "paused")


async def test_rollout_actions_from_the_rollouts_screen(fleet: Controller) -> None:
    start_paused_rollout(fleet, 1)
    actor = fleet.actor("operator")
    script, done = Script(snapshot_of(fleet)), Done()
    app = app_for(fleet, script)
    async with app.run_test(size=SIZE, message_hook=done) as pilot:
        await pilot.press("2")
        await pilot.pause()
        audited = len(audit_of(fleet, actor))
        for key in ("p", "r", "P", "F", "a"):  # cancelled: no change, nothing audited
            await cancel(pilot, key)
        assert len(audit_of(fleet, actor)) == audited
        view = rollout_phase(fleet, 1)
        assert (view.phase, view.paused_by, view.pause_reason) == ("paused", None, "CanaryPauseStep")

        assert await confirm(pilot, "p", "lunch") == "fleetctl rollout pause 1 --reason lunch"
        assert (await done.next(1)).ok
        assert rollout_phase(fleet, 1).paused_by == actor
        assert audit_of(fleet, actor)[-1].reason == "lunch"
        same_as_cli(fleet, "fleetctl rollout pause 1 --reason lunch", actor)

        await confirm(pilot, "r", "back from lunch")
        assert (await done.next(2)).detail.startswith("rollout 1 (smollm2-135m): resume -> ")
        assert rollout_phase(fleet, 1).paused_by is None

        await confirm(pilot, "P", "looks good")
        assert (await done.next(3)).ok
        wait_for(lambda: rollout_phase(fleet, 1).phase == "completed")

        start_paused_rollout(fleet, 2, undo_of=1)
        script.send(snapshot_of(fleet, 2))
        await pilot.pause(0.3)
        await pilot.press("up")  # the cursor stayed on rollout 1, now finished; the active one is on top
        assert await confirm(pilot, "F", "all at once") == "fleetctl rollout promote 2 --full --reason 'all at once'"
        assert (await done.next(4)).ok
        finished = wait_for(lambda: (v := rollout_phase(fleet, 2)).phase == "completed" and v)
        assert {ref: w for ref, w in finished.weights.items() if w > 0} == {"chat@r1": 100.0}

        start_paused_rollout(fleet, 3, undo_of=2)
        script.send(snapshot_of(fleet, 3))
        await pilot.pause(0.3)
        await pilot.press("up")
        await confirm(pilot, "a", "changed my mind")
        assert (await done.next(5)).ok
        aborted = wait_for(lambda: (v := rollout_phase(fleet, 3)).phase == "aborted" and v)
        assert aborted.abort_reason.endswith("changed my mind")
        reasons = [e.reason for e in audit_of(fleet, actor)
                   if e.action == "rollout.command" and e.reason != "back again"]
        assert reasons == ["lunch", "lunch", "back from lunch", "looks good", "all at once", "changed my mind"]


async def test_a_refused_action_says_why_in_one_line(fleet: Controller) -> None:
    start_paused_rollout(fleet, 1)
    script, done = Script(snapshot_of(fleet)), Done()
    app = app_for(fleet, script)
    async with app.run_test(size=SIZE, message_hook=done) as pilot:
        await pilot.press("2")
        await pilot.pause()
        with fleet.client("operator") as api:
            api.rollout_command(1, "abort", reason="behind the TUI's back")
        wait_for(lambda: rollout_phase(fleet, 1).phase == "aborted")
        await confirm(pilot, "r", "resume it")  # the screen has not heard of the abort: the controller refuses
        refused = await done.next(1)
        assert not refused.ok and "\n" not in refused.detail and refused.detail
        assert any(n.severity == "error" and n.message == refused.detail for n in app._notifications)


async def test_node_and_engine_actions(fleet: Controller) -> None:
    register(fleet, "n2").close()
    actor = fleet.actor("operator")
    app, done = app_for(fleet, Script(snapshot_of(fleet))), Done()
    with fleet.client("viewer") as api:
        engine = next(e for e in api.list_engines() if e.node == "n1")
    async with app.run_test(size=SIZE, message_hook=done) as pilot:
        await pilot.pause()
        audited = len(audit_of(fleet, actor))
        for action in (actions.cordon_node("n2"), actions.drain_node("n1"), actions.drain_engine("n1", engine.name)):
            actions.request_action(app, action)
            await pilot.pause()
            await paste(pilot, "no")
            await pilot.press("escape")
            await pilot.pause()
        assert len(audit_of(fleet, actor)) == audited
        with fleet.client("viewer") as api:
            assert not api.get_node("n2").cordoned and not api.get_node("n1").draining
            assert not api.get_engine(engine.name).drain

        steps = [(actions.cordon_node("n2"), lambda api: api.get_node("n2").cordoned),
                 (actions.uncordon_node("n2"), lambda api: not api.get_node("n2").cordoned),
                 (actions.drain_engine("n1", engine.name), lambda api: _drained(api, engine.name)),
                 (actions.drain_node("n2"), lambda api: api.get_node("n2").draining)]
        for count, (action, changed) in enumerate(steps, start=1):
            actions.request_action(app, action)
            await pilot.pause()
            await paste(pilot, f"step {count}")
            await pilot.press("enter")
            assert (await done.next(count)).ok, done.messages[-1]
            with fleet.client("viewer") as api:
                assert changed(api), action.title
            assert audit_of(fleet, actor)[-1].reason == f"step {count}"
            if action.title.startswith(("Cordon", "Uncordon", "Drain node")):
                same_as_cli(fleet, action.command_for(f"step {count}"), actor)


async def test_engine_cordon_and_uncordon_from_the_engine_detail(fleet: Controller) -> None:
    with fleet.client("operator") as api:
        api.set_deployment("chat", "chat@r1", 2)
        wait_for(lambda: api.get_traffic(MODEL).revisions[0].ready_engines == 2)
        engine = sorted(api.list_engines(), key=lambda e: e.name)[0]
    actor = fleet.actor("operator")
    app, done = app_for(fleet, Script(snapshot_of(fleet))), Done()
    async with app.run_test(size=SIZE, message_hook=done) as pilot:
        app.open_engine(f"{engine.node}/{engine.name}")
        await pilot.pause()
        audited = len(audit_of(fleet, actor))
        await cancel(pilot, "c")
        assert len(audit_of(fleet, actor)) == audited
        shown = await confirm(pilot, "c", "suspect answers")
        assert shown == f"fleetctl engine cordon {engine.name} --no-wait --yes --reason 'suspect answers'"
        assert (await done.next(1)).detail == f"engine {engine.name}: cordoned, no new requests"
        with fleet.client("viewer") as api:
            assert api.get_engine(engine.name).cordoned
            assert api.get_traffic(MODEL).revisions[0].ready_engines == 1
        same_as_cli(fleet, shown, actor)
        await confirm(pilot, "u", "cleared")
        assert (await done.next(2)).ok
        with fleet.client("viewer") as api:
            assert not api.get_engine(engine.name).cordoned
        assert audit_of(fleet, actor)[-1].reason == "cleared"


def _drained(api: Any, name: str) -> bool:
    try:
        return api.get_engine(name).drain
    except Exception:  # already stopped and forgotten: drained
        return True


async def test_set_weights_from_the_traffic_screen(fleet: Controller) -> None:
    with fleet.client("operator") as api:
        api.set_deployment("chat-b", "chat@r2", 1)
        wait_for(lambda: [r.ready_engines for r in api.get_traffic(MODEL).revisions] == [1, 1])
    actor = fleet.actor("operator")
    audited = len(audit_of(fleet, actor))
    app, done = app_for(fleet, Script(snapshot_of(fleet))), Done()
    async with app.run_test(size=SIZE, message_hook=done) as pilot:
        await pilot.press("4")
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        weights = app.screen
        assert isinstance(weights, WeightsScreen) and weights.refs == ["chat@r1", "chat@r2"]
        weights.field("chat@r1").value, weights.field("chat@r2").value = "90", "ten"
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is weights  # refused before any confirmation, naming the field
        assert weights.query_one("#weights-hint").content.plain == "chat@r2: 'ten' is not a number"
        weights.field("chat@r2").value = "10"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("escape")  # cancelled at the confirmation: nothing stored
        await pilot.pause()
        with fleet.client("viewer") as api:
            assert api.get_traffic(MODEL).weights == {"chat@r1": 100.0}
        assert len(audit_of(fleet, actor)) == audited

        await pilot.press("w")
        await pilot.pause()
        app.screen.field("chat@r2").value = "10"
        app.screen.field("chat@r1").value = "90"
        await pilot.press("enter")
        await pilot.pause()
        shown = await confirm(pilot, "", "canary r2")
        assert shown == f"fleetctl traffic set {MODEL} chat@r1=90 chat@r2=10 --no-wait --reason 'canary r2'"
        assert (await done.next(1)).ok
        with fleet.client("viewer") as api:
            assert api.get_traffic(MODEL).weights == {"chat@r1": 90.0, "chat@r2": 10.0}
        same_as_cli(fleet, shown, actor)


async def test_a_viewer_token_refuses_every_action_without_a_modal(fleet: Controller) -> None:
    start_paused_rollout(fleet, 1)
    app, done = app_for(fleet, Script(snapshot_of(fleet)), role="viewer"), Done()
    async with app.run_test(size=SIZE, message_hook=done) as pilot:
        await wait_until(lambda: app.readonly)  # learnt from the token's role, in a worker
        assert app.readonly_reason == "viewer token"
        await pilot.press("2")
        await pilot.pause()
        for key in "prPFa":
            await pilot.press(key)
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("4", "w")
        await pilot.pause()
        assert type(app.screen).__name__ not in ("ConfirmScreen", "WeightsScreen")
        for action in (actions.cordon_node("n1"), actions.drain_node("n1"), actions.uncordon_node("n1"),
                       actions.drain_engine("n1", "chat-0")):
            actions.request_action(app, action)
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen)
    assert [(d.ok, d.detail) for d in done.messages] == [(False, "read-only: viewer token")] * 10
    assert rollout_phase(fleet, 1).paused_by is None


async def test_the_traffic_screen_reads_the_controllers_generation(fleet: Controller) -> None:
    """Gateways against the controller's routing generation, which the screen reads in a worker."""
    with fleet.client("viewer") as api:
        generation = api.routing().generation
        api.report_gateway({"name": "gw-now", "url": "http://gw-now:8000", "generation": generation,
                            "table_age_s": 0.5})
        api.report_gateway({"name": "gw-behind", "url": "http://gw-behind:8000", "generation": generation - 1,
                            "table_age_s": 4.0})
    app = app_for(fleet, Script(snapshot_of(fleet)), role="viewer")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        table = app.screen.query_one("#gateways-table")
        title = await wait_until(lambda: "generation" in (table.border_title or "") and table.border_title)
        assert f"generation {generation} applied by 1/2 live" in title
        assert table.get_row("gw-now")[3].plain == f"{generation} = {generation}"
        assert table.get_row("gw-behind")[3].plain == f"{generation - 1} < {generation}"
