"""The TUI driven by keys (Textual's Pilot) on a scripted stream and a fixed clock: switching screens,
filter, sort, the engine detail and back, help, stale and recovered, read-only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import Static
from uicore_data import NOW, Script, change, delta, event, fixed_clock, metrics_delta, small_fleet

from fleetctl.errors import AuthError
from fleetctl.watch_client import Disconnected
from ui.app import FleetApp, make_app
from ui.screens.engine import EngineScreen
from ui.screens.fleet import FleetScreen
from ui.widgets.footer import KeysFooter
from ui.widgets.header import PulseHeader
from ui.widgets.help import HelpScreen
from ui.widgets.table import VirtualTable


@asynccontextmanager
async def running(script: Script, size: tuple[int, int] = (120, 32), **options: Any) -> AsyncIterator[Pilot]:
    app = make_app(source=script, clock=fixed_clock, **options)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        yield pilot


def plain(renderable: Any) -> str:
    return renderable.plain if isinstance(renderable, Text) else str(renderable)


def header_text(app: FleetApp) -> str:
    return plain(app.screen.query_one(PulseHeader).render())


def footer_text(app: FleetApp) -> str:
    return plain(app.screen.query_one(KeysFooter).render())


def table_lines(app: FleetApp) -> list[str]:
    table = app.screen.query_one(VirtualTable)
    return [table.render_line(y).text for y in range(table.size.height)]


def fleet_table(app: FleetApp) -> VirtualTable:
    return app.get_screen("fleet").query_one(VirtualTable)


async def test_first_snapshot_fills_the_fleet_screen_and_the_header() -> None:
    async with running(Script(small_fleet())) as pilot:
        app = pilot.app
        assert isinstance(app.screen, FleetScreen)
        lines = table_lines(app)
        assert lines[0].split()[:5] == ["NODE↑", "ENGINE", "ROLE", "CLASS", "STATE"]
        assert lines[1].split()[:5] == ["node-1", "e-1", "prefill", "chat@r1", "ready"]
        assert any("node-3" in line and "down" in line for line in lines)
        header = header_text(app)
        assert "ctl controller-0 (leader)" in header and "req/s 12.3" in header and "tok/s 4.6k" in header
        assert "TTFT p50 120ms p90 340ms" in header and "frozen: no" in header
        assert fleet_table(app).border_title.startswith("Fleet: 4 nodes, 6 engines")


async def test_number_keys_and_the_command_line_switch_screens() -> None:
    async with running(Script(small_fleet())) as pilot:
        app = pilot.app
        await pilot.press("2")
        assert app.screen_name() == "rollouts"
        await pilot.press("5")
        assert app.screen_name() == "events"
        await pilot.press("escape")  # back to where it came from
        assert app.screen_name() == "rollouts"
        await pilot.press(":", *"canary", "enter")
        assert app.screen_name() == "quality"
        await pilot.press(":", *"no", "enter")
        assert app.screen_name() == "fleet"
        await pilot.press(":", *"nosuch", "enter")
        assert app.screen_name() == "fleet"
        await pilot.press(":", "q", "enter")
        await pilot.pause()
        assert app.return_code == 0


async def test_q_quits() -> None:
    async with running(Script(small_fleet())) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert pilot.app.return_code == 0


async def test_a_command_can_switch_and_filter() -> None:
    async with running(Script(small_fleet())) as pilot:
        await pilot.press("2", ":", *"fleet state:failed", "enter")
        await pilot.pause()
        assert pilot.app.screen_name() == "fleet"
        assert fleet_table(pilot.app).keys == ["node-2/e-3"]


async def test_filter_as_typed_and_esc_clears_it() -> None:
    async with running(Script(small_fleet())) as pilot:
        app = pilot.app
        await pilot.press("/", *"role:decode")
        assert fleet_table(app).keys == ["node-1/e-2", "node-2/e-3", "node-10/e-5"]
        await pilot.press("enter")
        assert "/role:decode (3 of 7)" in fleet_table(app).border_title
        assert app.focused is fleet_table(app)  # back on the table
        await pilot.press("/", "escape")
        assert len(fleet_table(app).keys) == 7


async def test_sort_keys_and_the_title() -> None:
    async with running(Script(small_fleet())) as pilot:
        app = pilot.app
        table = fleet_table(app)
        await pilot.press("K")  # shift+k: by KV usage, ascending; again: descending
        await pilot.press("K")
        assert table.keys[0] == "node-2/e-4" and "sort KV↓" in table.border_title
        assert table_lines(app)[0].split()[7] == "KV↓"
        await pilot.press("exclamation_mark")
        assert "sort KV↑" in table.border_title
        await pilot.press("less_than_sign")  # the column left of KV
        assert "sort RUN/WAIT↑" in table.border_title


async def test_live_deltas_update_rows_in_place() -> None:
    script = Script(small_fleet())
    async with running(script) as pilot:
        app = pilot.app
        fleet_table(app).move_to("node-1/e-2")
        script.push(delta(change("engine", "node-1/e-1", {"state": "failed"})))
        await pilot.pause()
        row = next(line.split() for line in table_lines(app) if line.split()[:2] == ["node-1", "e-1"])
        assert row[4] == "failed"
        assert fleet_table(app).cursor_key == "node-1/e-2"  # the cursor stays on its row


async def test_enter_opens_the_engine_detail_and_esc_goes_back() -> None:
    script = Script(small_fleet(events=[event(1, "node-10/e-6", "drain node-10/e-6 refused")]))
    for step in range(12):
        script.push(metrics_delta("node-10/e-6", step, f"e1-{step + 2}"))
    async with running(script) as pilot:
        app = pilot.app
        fleet_table(app).move_to("node-10/e-6")
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, EngineScreen) and screen.key == "node-10/e-6"
        assert "- max_num_seqs: declared 64, runs 32 (engine)" in plain(screen.query_one("#engine-drift", Static).content)
        assert "drain node-10/e-6 refused" in plain(screen.query_one("#engine-events", Static).content)
        assert "need a controller client" in plain(screen.query_one("#engine-class", Static).content)
        assert len(app.history.series("node-10/e-6", "ttft")) == 13
        script.push(metrics_delta("node-10/e-6", 99, "e1-99"))
        await pilot.pause()
        assert plain(screen.query_one("#spark-label-queue", Static).content) == "queue 4"  # 99 % 5 + 99 % 3
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)


async def test_help_lists_every_screen_and_closes() -> None:
    async with running(Script(small_fleet())) as pilot:
        await pilot.press("question_mark")
        screen = pilot.app.screen
        assert isinstance(screen, HelpScreen)
        titles = [title for title, _ in screen.sections]
        assert titles[0] == "Everywhere" and any(t.startswith("1 Fleet") for t in titles)
        assert any(t.startswith("5 Events") for t in titles) and titles[-1].startswith("Engine detail")
        fleet_keys = dict(next(keys for title, keys in screen.sections if title.startswith("1 Fleet")))
        assert fleet_keys["d"] == "drain" and fleet_keys["D"] == "drain node"
        await pilot.press("escape")
        assert isinstance(pilot.app.screen, FleetScreen)


async def test_stale_while_cut_off_then_live_again() -> None:
    script = Script(small_fleet())
    async with running(script) as pilot:
        app = pilot.app
        script.push(Disconnected(error="controller unreachable", at=NOW + timedelta(seconds=5), retry_in_s=2.0))
        await pilot.pause()
        header = app.screen.query_one(PulseHeader)
        assert header.has_class("-stale") and app.stale_since == NOW + timedelta(seconds=5)
        assert header_text(app).startswith("STALE since 12:00:35 (controller unreachable), retry in 2.0s")
        await pilot.press("2")  # another screen's header says so too
        assert app.screen.query_one(PulseHeader).has_class("-stale")
        script.push(small_fleet(token="e2-1"))
        await pilot.pause()
        assert not app.screen.query_one(PulseHeader).has_class("-stale") and app.stale_since is None
        assert "STALE" not in header_text(app)


async def test_the_stale_header_counts_down_to_the_retry() -> None:
    now = [NOW]
    script = Script(small_fleet())
    app = make_app(source=script, clock=lambda: now[0])
    async with app.run_test(size=(120, 32)) as pilot:
        await pilot.pause()
        script.push(Disconnected(error="controller unreachable", at=NOW, retry_in_s=5.0))
        await pilot.pause()
        assert "), retry in 5.0s" in header_text(app)
        now[0] = NOW + timedelta(seconds=3)
        app.tick_countdown()  # what the app's one-second timer calls
        await pilot.pause()
        assert "), retry in 2.0s" in header_text(app)
        now[0] = NOW + timedelta(seconds=9)  # overdue: the stream is trying
        app.tick_countdown()
        await pilot.pause()
        assert "), retry in 0.0s" in header_text(app)
        script.push(small_fleet(token="e2-1"))
        await pilot.pause()
        assert app.retry_in_s is None and "retry" not in header_text(app)


async def test_a_stream_that_fails_for_good_reads_stale_with_why() -> None:
    async def refused() -> AsyncIterator[Any]:
        yield small_fleet()
        raise AuthError("token unknown or revoked", status=401)

    async with running(refused()) as pilot:  # type: ignore[arg-type]
        await pilot.pause()
        assert pilot.app.stale_since == NOW  # the app's clock
        assert "the change stream stopped: token unknown or revoked" in header_text(pilot.app)


async def test_readonly_footer_hides_the_actions() -> None:
    async with running(Script(small_fleet()), readonly=True) as pilot:
        footer = footer_text(pilot.app)
        assert footer.startswith("read-only (--readonly)")
        assert "d drain" not in footer and "enter detail" in footer
    async with running(Script(small_fleet())) as pilot:
        footer = footer_text(pilot.app)
        assert "read-only" not in footer and "d drain" in footer and "c cordon" in footer


async def test_narrow_terminal_keeps_the_main_columns() -> None:
    async with running(Script(small_fleet()), size=(80, 24)) as pilot:
        header = table_lines(pilot.app)[0].split()
        assert header[:5] == ["NODE↑", "ENGINE", "ROLE", "CLASS", "STATE"] and "KV" in header and "TTFT" in header
        assert all(len(line) <= 80 for line in table_lines(pilot.app))
