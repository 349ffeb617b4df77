"""The Traffic screen: each model's weights over its class revisions (weight, share, ready engines), a
misroute drill in effect on top of them, and the gateways: URL, routing-table age, the generation each
has applied against the controller's, live or stale.

The controller's routing generation is not on the change stream: a worker reads it (GET /api/v1/routing)
when the screen is shown, and again while traffic or gateways change, at most every GENERATION_EVERY_S.

Key `w`: new weights for the selected model (ui/widgets/weights.py), then the confirmation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable, Static

from fleetctl.controller.contract import GatewayView
from fleetctl.controller.responses import TrafficView
from fleetctl.errors import FleetError
from fleetctl.watch_state import Applied, FleetState
from ui import actions
from ui.present import traffic as present
from ui.present.timefmt import Countdowns
from ui.screens.base import BaseScreen
from ui.widgets.table_sync import FitTable, selected_key, set_columns, sync_rows
from ui.widgets.weights import WeightsScreen

GENERATION_EVERY_S = 5.0
NO_TRAFFIC = "no models: nothing is deployed"


@dataclass
class ControllerGeneration(Message):
    """The controller's routing-table generation, read by the worker (None: could not be read)."""

    generation: int | None
    error: str | None = None


class TrafficScreen(BaseScreen):
    HEADING = "Traffic"
    FLEET_ACTIONS = frozenset({"set_weights"})
    BINDINGS: ClassVar[list[BindingType]] = [Binding("w", "set_weights", "set weights")]

    def __init__(self) -> None:
        super().__init__(name="traffic")
        self._traffic: Mapping[str, TrafficView] = {}
        self._gateways: Mapping[str, GatewayView] = {}
        self._generation: int | None = None
        self._generation_wanted = True
        self._drill_clock = Countdowns()

    def compose_body(self) -> ComposeResult:
        yield set_columns(FitTable(id="traffic-table", cursor_type="row"), present.REVISION_COLUMNS)
        yield Static(Text(NO_TRAFFIC, style="dim"), id="traffic-empty")
        yield Static(id="traffic-drills")
        yield set_columns(DataTable(id="gateways-table", cursor_type="row"), present.GATEWAY_COLUMNS)

    def on_mount(self) -> None:
        table = self.query_one("#traffic-table", DataTable)
        table.border_title = "Traffic: weights over class revisions"
        table.focus()
        self._draw()
        self.set_interval(1.0, self._tick, name="drill countdown")
        self.set_interval(GENERATION_EVERY_S, self._maybe_read_generation, name="routing generation")

    # --- state in ---

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        if not (applied.touches("traffic") or applied.touches("gateway")):
            return
        now = self.app.clock()
        self._traffic, self._gateways = fleet.traffic(), fleet.gateways()
        for model, view in self._traffic.items():
            drill = view.drill
            self._drill_clock.observe(model, drill.remaining_s if drill is not None and drill.active else None, now)
        self._drill_clock.keep_only(self._traffic)
        if applied.reset:
            self._read_generation()
        else:
            self._generation_wanted = True
        self._draw()

    def on_controller_generation(self, message: ControllerGeneration) -> None:
        if message.generation is not None:
            self._generation = message.generation
        self._draw_gateways()

    def _maybe_read_generation(self) -> None:
        if self._generation_wanted:
            self._read_generation()

    @work(exclusive=True, group="routing-generation", exit_on_error=False)
    async def _read_generation(self) -> None:
        self._generation_wanted = False
        client = self.app.client
        if client is None:
            return
        try:
            table = await client.routing()
        except FleetError as exc:
            self.post_message(ControllerGeneration(None, actions.one_line(exc)))
            return
        self.post_message(ControllerGeneration(table.generation))

    # --- drawing ---

    def _tick(self) -> None:
        if any(view.drill is not None and view.drill.active for view in self._traffic.values()):
            self._draw_drills()

    def _draw(self) -> None:
        rows = present.revision_rows(self._traffic)
        sync_rows(self.query_one("#traffic-table", DataTable), rows)
        self.query_one("#traffic-empty", Static).display = not rows
        self._draw_drills()
        self._draw_gateways()

    def _draw_drills(self) -> None:
        now = self.app.clock()
        lines = present.drill_lines(self._traffic, {m: self._drill_clock.left(m, now) for m in self._traffic})
        drills = self.query_one("#traffic-drills", Static)
        drills.display = bool(lines)
        drills.update(Text("\n").join(lines))

    def _draw_gateways(self) -> None:
        table = self.query_one("#gateways-table", DataTable)
        sync_rows(table, present.gateway_rows(self._gateways, self._generation))
        table.border_title = Text.assemble("Gateways: ", present.gateway_summary(self._gateways.values(),
                                                                              self._generation))

    # --- setting weights ---

    def selected_model(self) -> str | None:
        key = selected_key(self.query_one("#traffic-table", DataTable))
        model = key.split("/", 1)[0] if key else None
        return model if model in self._traffic else None

    def action_set_weights(self) -> None:
        model = self.selected_model()
        if model is None:
            self.app.notify("no model selected", severity="warning")
            return
        if self.app.readonly:  # refused before the weights are asked for, as every action is
            actions.request_action(self.app, actions.set_weights(model, dict(self._traffic[model].weights)))
            return

        def chosen(weights: dict[str, float] | None) -> None:
            if weights is not None:
                actions.request_action(self.app, actions.set_weights(model, weights))

        self.app.push_screen(WeightsScreen(model, present.weighted_revisions(self._traffic[model])), chosen)
