"""Snapshot tests (pytest-textual-snapshot) of the Rollouts, Quality, Traffic and Events screens at 80x24 and
200x50, on the scripted data of tests/ui/uiscreens_data.py and a frozen clock. Refresh them with
`pytest tests/ui/test_ui_screens_snapshots.py --snapshot-update`, then look at the SVGs."""

from __future__ import annotations

from typing import Any

import pytest
from uiscreens_data import FrozenClock, Script, snapshot

from ui.app import make_app

SCREENS = [("rollouts", "2"), ("quality", "3"), ("traffic", "4"), ("events", "5")]
SIZES = [(80, 24), (200, 50)]


def scripted_app() -> Any:
    return make_app("http://127.0.0.1:9", None, False, source=Script(snapshot()), clock=FrozenClock())


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize(("name", "key"), SCREENS, ids=[name for name, _ in SCREENS])
def test_screen_snapshot(snap_compare: Any, name: str, key: str, size: tuple[int, int]) -> None:
    async def show(pilot: Any) -> None:
        await pilot.pause()
        await pilot.press(key)
        await pilot.pause()

    assert snap_compare(scripted_app(), run_before=show, terminal_size=size)
