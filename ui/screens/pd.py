"""The P:D screen: per model the prefill:decode ratio, the prefill and decode queues, the planner's mode and
advice, and a rebalance in progress; below, the selected model's engines by role and the planner's reasoning,
line by line.

P:D state is not on the change stream: a worker reads it (GET /api/v1/pd/models) when the screen is shown and
every POLL_S while it is.

Keys: `p` one more prefill engine (a decode engine flips), `d` one more decode engine, `x` stop the rebalance
in progress after its current flip; each behind the confirmation, like every action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable, Static

from fleetctl.controller.pd_responses import PdModelView
from fleetctl.errors import FleetError
from fleetctl.watch_state import Applied, FleetState
from ui import actions
from ui.present import pd as present
from ui.screens.base import BaseScreen
from ui.widgets.table_sync import FitTable, selected_key, set_columns, sync_rows

POLL_S = 2.0
NO_MODELS = "no models: nothing is deployed"


@dataclass
class PdStatus(Message):
    models: Sequence[PdModelView] | None
    error: str | None = None


class PdScreen(BaseScreen):
    HEADING = "P:D"
    FLEET_ACTIONS = frozenset({"more_prefill", "more_decode", "stop_rebalance"})
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "more_prefill", "+1 prefill"),
        Binding("d", "more_decode", "+1 decode"),
        Binding("x", "stop_rebalance", "stop rebalance"),
    ]

    def __init__(self) -> None:
        super().__init__(name="pd")
        self._models: dict[str, PdModelView] = {}
        self._error: str | None = None

    def compose_body(self) -> ComposeResult:
        yield set_columns(FitTable(id="pd-models", cursor_type="row"), present.MODEL_COLUMNS)
        yield Static(Text(NO_MODELS, style="dim"), id="pd-empty")
        yield set_columns(DataTable(id="pd-engines", cursor_type="row"), present.ENGINE_COLUMNS)
        yield Static(id="pd-reasoning")

    def on_mount(self) -> None:
        table = self.query_one("#pd-models", DataTable)
        table.border_title = "P:D: prefill and decode engines per model"
        table.focus()
        self._draw()
        self._poll()
        self.set_interval(POLL_S, self._poll, name="pd status")

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        if applied.reset:
            self._poll()

    @work(exclusive=True, group="pd-status", exit_on_error=False)
    async def _poll(self) -> None:
        client = self.app.client
        if client is None:
            return
        try:
            models = await client.pd_status()
        except FleetError as exc:
            self.post_message(PdStatus(None, actions.one_line(exc)))
            return
        self.post_message(PdStatus(models))

    def on_pd_status(self, message: PdStatus) -> None:
        if message.models is not None:
            self._models, self._error = {m.model: m for m in message.models}, None
        else:
            self._error = message.error  # the last state read stays shown
        self._draw()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "pd-models":
            self._draw_detail()

    # --- drawing ---

    def _draw(self) -> None:
        rows = present.model_rows(list(self._models.values()))
        sync_rows(self.query_one("#pd-models", DataTable), rows)
        self.query_one("#pd-empty", Static).display = not rows
        self._draw_detail()

    def _draw_detail(self) -> None:
        model = self._models.get(self.selected_model() or "")
        engines = self.query_one("#pd-engines", DataTable)
        sync_rows(engines, present.engine_rows(model))
        engines.border_title = f"Engines of {model.model}" if model else "Engines"
        text = present.reasoning(model)
        if self._error:
            text = Text.assemble(text, "\n", (f"P:D status not read: {self._error}", "orange_red1"))
        self.query_one("#pd-reasoning", Static).update(text)

    # --- actions ---

    def selected_model(self) -> str | None:
        table = self.query_one("#pd-models", DataTable)
        key = selected_key(table)
        return key if key in self._models else (next(iter(sorted(self._models)), None) if self._models else None)

    def _shift(self, to_prefill: int) -> None:
        model = self._models.get(self.selected_model() or "")
        if model is None:
            self.app.notify("no model selected", severity="warning")
            return
        prefill, decode = model.ratio.prefill + to_prefill, model.ratio.decode - to_prefill
        if min(prefill, decode) < 1:
            self.app.notify(f"{model.model}: a role would have no engine left", severity="warning")
            return
        actions.request_action(self.app, actions.rebalance(model.model, prefill, decode))

    def action_more_prefill(self) -> None:
        self._shift(+1)

    def action_more_decode(self) -> None:
        self._shift(-1)

    def action_stop_rebalance(self) -> None:
        model = self._models.get(self.selected_model() or "")
        if model is None or model.rebalance is None:
            self.app.notify("no rebalance in progress", severity="warning")
            return
        actions.request_action(self.app, actions.stop_rebalance(model.model, model.rebalance.id))
