"""The child of benchmarks/tui.py's first-screen timing: what `fleetctl tui` loads (the CLI's command tree and
the TUI), run headless at 200x50 against the controller, printing the wall time once the Fleet screen holds
every engine. A module of its own so that the benchmark's own imports (the controller it starts, SQLAlchemy,
FastAPI) are not counted as the TUI's start-up.

    .venv/bin/python benchmarks/tui_first_screen.py URL TOKEN ENGINES
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fleetctl.cli.main  # noqa: E402,F401  (what `fleetctl tui` imports before the TUI)
from ui.app import make_app  # noqa: E402
from ui.screens.fleet import FleetScreen  # noqa: E402
from ui.widgets.table import VirtualTable  # noqa: E402


def fleet_screen_full(app: Any, engines: int) -> bool:
    screen = app.screen
    if not isinstance(screen, FleetScreen) or len(app.fleet.resources.get("engine", {})) < engines:
        return False
    tables = list(screen.query(VirtualTable))
    return bool(tables) and len(tables[0].keys) >= engines


async def main(url: str, token: str, engines: int) -> None:
    app = make_app(url, token, readonly=True)
    async with app.run_test(headless=True, size=(200, 50)) as pilot:
        while not fleet_screen_full(app, engines):
            await pilot.pause(0.02)
        print(time.time(), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
