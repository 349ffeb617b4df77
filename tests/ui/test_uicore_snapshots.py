"""Snapshots (SVG, tests/ui/__snapshots__/) of the Fleet screen and the engine detail at 80x24 and 200x50,
on fixed data and a fixed clock. The engine detail reads its class revision from a real controller on
loopback. Regenerate after a deliberate change with `pytest tests/ui --snapshot-update`, and look at them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static
from uicore_data import Script, fixed_clock, metrics_delta, small_fleet

from fleetctl.client import AsyncControllerClient, ControllerClient
from fleetctl.controller.server import ServerThread
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens
from ui.app import make_app
from ui.widgets.table import VirtualTable

SIZES = [(80, 24), (200, 50)]
CLASS_SPEC = {"model": "smollm2-135m", "weights": "smollm2", "max_num_seqs": 64}


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A real controller with class chat@r1 (the small fleet's class)."""
    tmp = tmp_path_factory.mktemp("uicore-snapshots")
    settings = ControllerSettings(db_url=f"sqlite:///{tmp / 'fleet.db'}", state_dir=tmp / "state", port=0)
    with ServerThread(settings) as server:
        tokens = role_tokens(server.runtime.store)
        with ControllerClient(server.url, tokens["admin"]) as api:
            assert api.apply_class("chat", CLASS_SPEC).ref == "chat@r1"
        yield server.url, tokens


def fleet_script() -> Script:
    script = Script(small_fleet())
    for step in range(40):
        script.push(metrics_delta("node-10/e-6", step, f"e1-{step + 2}"))
    return script


async def settle(pilot: Pilot) -> None:
    await pilot.pause()
    await pilot.pause()


async def open_engine(pilot: Pilot) -> None:
    await settle(pilot)
    pilot.app.screen.query_one(VirtualTable).move_to("node-10/e-6")
    await pilot.press("enter")
    for _ in range(100):  # the class revision arrives from the controller in a worker
        await pilot.pause(0.05)
        panel = pilot.app.screen.query_one("#engine-class", Static)
        if "loading" not in str(getattr(panel.content, "plain", panel.content)):
            break
    await settle(pilot)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fleet_screen(snap_compare: Any, size: tuple[int, int]) -> None:
    app = make_app(source=fleet_script(), clock=fixed_clock)
    assert snap_compare(app, terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_engine_detail(snap_compare: Any, size: tuple[int, int], controller: tuple[str, dict[str, str]]) -> None:
    url, tokens = controller
    app = make_app(url, source=fleet_script(), client=AsyncControllerClient(url, tokens["operator"]),
                   clock=fixed_clock)
    assert snap_compare(app, terminal_size=size, run_before=open_engine)

