"""Pilot tests of the Rollouts, Quality, Traffic and Events screens on scripted data (tests/ui/uiscreens_data.py)
and a frozen clock: the pause counts down as the clock moves, "not measured" where the canary has no verdict
(and plainly when it has no data), the evidence follows the cursor, the traffic screen's gateways and
drill, the events screen's live follow and its `/` filter."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static
from uiscreens_data import MODEL, FrozenClock, Script, at, delta, event, paused_rollout, snapshot

from ui.app import make_app
from ui.screens.events import EventsScreen
from ui.screens.quality import QualityScreen
from ui.screens.rollouts import RolloutsScreen
from ui.screens.traffic import TrafficScreen

URL = "http://127.0.0.1:9"  # nothing listens: these tests never reach a controller


def text_of(widget: Any) -> str:
    content = widget.content
    return content.plain if isinstance(content, Text) else str(content)


def title_of(widget: Any) -> str:
    return Text.from_markup(widget.border_title or "").plain


def app_with(script: Script, clock: FrozenClock | None = None, **kwargs: Any) -> Any:
    return make_app(URL, None, kwargs.pop("readonly", False), source=script, clock=clock or FrozenClock(), **kwargs)


async def test_a_timed_pause_counts_down_with_the_app_clock() -> None:
    clock = FrozenClock()
    app = app_with(Script(snapshot()), clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RolloutsScreen)
        assert "pause step, 1m35s left" in text_of(screen.query_one("#rollout-detail", Static))
        clock.advance(30)
        await pilot.pause(1.2)  # the screen's one-second tick redraws
        assert "pause step, 1m05s left" in text_of(screen.query_one("#rollout-detail", Static))
        table = screen.query_one("#rollouts-table", DataTable)
        assert table.get_cell("7", "PAUSE").plain == "1m05s"
        assert [str(k.value) for k in table.rows] == ["7", "3"]


async def test_without_an_end_from_the_controller_the_pause_counts_down_from_when_it_was_seen() -> None:
    clock = FrozenClock()
    older = paused_rollout().model_copy(update={"pause_ends_at": None})  # a controller that sends no end
    app = app_with(Script(snapshot(rollouts=[older])), clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        clock.advance(30)
        await pilot.pause(1.2)
        assert "pause step, 1m05s left" in text_of(app.screen.query_one("#rollout-detail", Static))


async def test_a_new_pause_end_moves_the_countdown_and_the_end_stops_it() -> None:
    clock = FrozenClock()
    script = Script(snapshot())
    app = app_with(script, clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        clock.advance(50)
        moved = {"pause_left_s": 40.0, "pause_ends_at": at(90)}  # e.g. the pause step began again
        script.send(delta(2, changes=[{"kind": "rollout", "key": "7", "op": "patch", "value": moved}]))
        await pilot.pause(0.3)
        detail = app.screen.query_one("#rollout-detail", Static)
        assert "pause step, 40s left" in text_of(detail)
        done = paused_rollout().model_copy(update={"phase": "progressing", "pause_reason": None, "pause_left_s": None,
                                                   "pause_ends_at": None})
        put = {"kind": "rollout", "key": "7", "op": "put", "value": done.model_dump(mode="json")}
        script.send(delta(3, changes=[put]))
        await pilot.pause(0.3)
        assert "left" not in text_of(detail)


async def test_quality_shows_not_measured_never_blank() -> None:
    app = app_with(Script(snapshot()))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, QualityScreen)
        grid = screen.query_one("#quality-grid", DataTable)
        chat_r2 = [cell.plain for cell in grid.get_row(f"{MODEL}/chat@r2")]
        assert chat_r2 == ["  chat@r2", "◆ drifting", "not measured", "✖ failing", "not measured", "·"]
        assert all(cell.plain.strip() for row in grid.rows for cell in grid.get_row(row))
        assert "drill 4: misroute 15%" in text_of(screen.query_one("#quality-drills", Static))


async def test_the_evidence_follows_the_cursor() -> None:
    app = app_with(Script(snapshot()))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await pilot.pause()
        grid = app.screen.query_one("#quality-grid", DataTable)
        grid.focus()
        grid.move_cursor(row=grid.get_row_index(f"{MODEL}/chat@r2"), column=3)  # b8
        await pilot.pause()
        evidence = text_of(app.screen.query_one("#quality-evidence", Static))
        assert "chat@r2 b8" in evidence and "bad 9 of 40 probes" in evidence and "blamed: chat@r2 chat-2" in evidence
        await pilot.press("right")  # b16: no stream was sent
        await pilot.pause()
        assert "chat@r2 b16: not measured" in text_of(app.screen.query_one("#quality-evidence", Static))
        await pilot.resize_terminal(80, 40)  # narrower than NARROW_BELOW: the grid is rebuilt, the cursor stays
        await pilot.pause()
        await pilot.pause()
        assert grid.cursor_coordinate == (grid.get_row_index(f"{MODEL}/chat@r2"), 4)
        assert "chat@r2 b16: not measured" in text_of(app.screen.query_one("#quality-evidence", Static))


async def test_quality_without_canary_data_says_not_measured_plainly() -> None:
    app = app_with(Script(snapshot(canary=[], drills=[], flags={"canary_probes": False})))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await pilot.pause()
        summary = text_of(app.screen.query_one("#quality-empty", Static))
        assert summary.startswith("not measured: canary probes are off")
        assert not app.screen.query_one("#quality-grid", DataTable).display


async def test_traffic_shows_weights_the_drill_and_each_gateway() -> None:
    clock = FrozenClock()
    app = app_with(Script(snapshot()), clock)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("4")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TrafficScreen)
        table = screen.query_one("#traffic-table", DataTable)
        assert table.get_row(f"{MODEL}/chat@r3")[1].plain == "chat@r3 ⚑ drill"
        assert "18m00s left" in text_of(screen.query_one("#traffic-drills", Static))
        clock.advance(60)
        await pilot.pause(1.2)
        assert "17m00s left" in text_of(screen.query_one("#traffic-drills", Static))
        gateways = screen.query_one("#gateways-table", DataTable)
        assert [gateways.get_row(name)[4].plain for name in ("gw-a", "gw-b", "gw-c")] == ["live", "live", "stale"]
        # no client reaches a controller here: the controller's generation is not known, and says so
        assert "not known yet" in title_of(gateways)


async def test_events_follow_live_unless_moved_up() -> None:
    many = [event(n, "audit", "info", f"n{n}", "node.cordon ok") for n in range(60)]
    script = Script(snapshot(fleet_events=many))
    app = app_with(script)
    async with app.run_test(size=(100, 24)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, EventsScreen)
        table = screen.table
        assert table.cursor_key == "audit:59" and table.scroll_y > 0  # the newest, at the bottom
        script.send(delta(2, events_added=[event(60, "canary", "alert", "chat@r2", "b8: healthy -> failing")]))
        await pilot.pause(0.3)
        assert table.keys[-1] == table.cursor_key == "canary:60"  # followed
        assert "b8: healthy -> failing" in text_of(screen.query_one("#event-detail", Static))
        await pilot.press("up", "up", "up")
        await pilot.pause()
        assert table.cursor_key == "audit:57"
        script.send(delta(3, events_added=[event(61, "audit", "info", "n61", "node.drain ok")]))
        await pilot.pause(0.3)
        assert table.keys[-1] == "audit:61" and table.cursor_key == "audit:57"  # added, not followed
        await pilot.press("G")
        await pilot.pause()
        assert table.cursor_key == "audit:61"


async def test_the_events_filter() -> None:
    script = Script(snapshot())
    app = app_with(script)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        table = app.screen.table
        assert len(table.keys) == 6
        await pilot.press("/", *"source:canary", "enter")
        await pilot.pause()
        assert table.keys == ["canary:3", "canary:6"]
        assert title_of(table) == "Events: 2 of 6 · /source:canary"
        script.send(delta(2, events_added=[event(7, "audit", "alert", "x", "audit line"),
                                           event(8, "canary", "alert", "y", "canary line")]))
        await pilot.pause(0.3)
        assert table.keys == ["canary:3", "canary:6", "canary:8"]  # new events filtered too
        await pilot.press("/", "ctrl+a", "ctrl+k", *"severity:alert !canary", "enter")
        await pilot.pause()
        assert table.keys == ["audit:5", "audit:7"]
        await pilot.press("/", "escape")
        await pilot.pause()
        assert len(table.keys) == 8 and title_of(table) == "Events: 8 of 8"
        assert not app.screen.query_one("#prompt").is_open
