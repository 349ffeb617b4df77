"""The engine detail (enter on a Fleet row): one engine, live.

- what it is: model, class revision, role, state, node, URL, pid, restarts, when it last reported;
- sparklines of TTFT, ITL, queue (running + waiting) and KV usage over its last samples (ui/history.py);
- live drift: each field it runs differently from its class revision (engine.drift);
- its class's KV tiers on its node, when the class has any: each tier's use, blocks, hit rate, read time;
- its class revision's fields, the correctness-tagged ones marked ● (they can change the tokens a request
  gets; fleetctl/replica_class.py), fetched once in a worker through the client and kept by the app;
- the latest events about it (fleet.events whose subject names it).

Keys: `d` drain it, `c`/`u` cordon/uncordon it (ui.actions: a confirmation first; refused when read-only),
esc back to the Fleet screen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any, ClassVar

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Sparkline, Static

from fleetctl.controller.responses import ClassRevisionView, NodeView
from fleetctl.controller.watch_contract import FleetEventView, WatchEngineView
from fleetctl.errors import FleetError
from fleetctl.replica_class import CORRECTNESS, ENGINE_ARGS, engine_arg_tag, field_tags
from fleetctl.watch_state import Applied, FleetState
from ui import actions
from ui import format as fmt
from ui.history import known
from ui.screens.base import BaseScreen

EVENTS_SHOWN = 8
SPARKS = (("ttft", "TTFT", fmt.seconds), ("itl", "ITL", fmt.seconds), ("queue", "queue", fmt.count),
          ("kv", "KV", fmt.percent))
MARK = "●"  # a correctness-tagged field
PERFORMANCE_MARK = "·"
NARROW = 120  # below this many columns the class revision and the events stack
MIB = 1 << 20


@dataclass
class ClassLoaded(Message):
    ref: str
    view: ClassRevisionView | None
    error: str | None = None


def names_engine(event: FleetEventView, key: str, name: str) -> bool:
    """Whether `event` is about the engine `key` (node/name)."""
    subject = event.subject
    return subject in (key, name) or subject.endswith(f"/{name}") or subject.startswith(f"{key} ")


def summary(engine: WatchEngineView, updated_age_s: float | None) -> str:
    reported = "never" if updated_age_s is None else f"{fmt.age(max(0.0, updated_age_s))} ago"
    drain = " (marked for drain)" if engine.drain and engine.state != "draining" else ""
    drain += " (cordoned: no new requests)" if engine.cordoned else ""
    return (f"{engine.model} · {engine.class_ref} · {engine.role} · {engine.state}{drain} · node {engine.node}\n"
            f"url {engine.url or fmt.NONE} · pid {engine.pid or fmt.NONE} · restarts {engine.restarts}"
            f"{' (last exit: ' + engine.last_exit + ')' if engine.last_exit else ''} · reported {reported}")


def drift_text(engine: WatchEngineView) -> Text:
    if not engine.drift:
        return Text("drift: none (runs as its class revision declares, as far as it reports)")
    text = Text()
    text.append(f"drift: {len(engine.drift)} field(s) differ from {engine.class_ref}", style="bold")
    for entry in engine.drift:
        text.append(f"\n- {entry.field}: declared {entry.declared!r}, runs {entry.actual!r} ({entry.source})")
    return text


def tiers_text(node: NodeView | None, class_name: str) -> Text | None:
    """The class's KV tiers on the engine's node, one line, or None when the node reports none for it."""
    tiers = [t for t in (node.kv_tiers if node is not None else []) if t.class_name == class_name]
    if not tiers:
        return None
    text = Text(f"KV tiers of {class_name} on {node.name}: ", style="bold")
    for index, tier in enumerate(tiers):
        if index:
            text.append("  ·  ")
        text.append(f"{tier.tier}{'' if tier.enabled else ' (off)'} ")
        text.append(f"{tier.used_bytes / MIB:.0f}/{tier.capacity_bytes / MIB:.0f} MiB, {fmt.count(tier.blocks)} blocks, "
                    f"hit {fmt.percent(tier.hit_rate)}, read {fmt.seconds(tier.mean_fetch_s)}")
    return text


def class_text(view: ClassRevisionView, drifted: Iterable[str]) -> Text:
    """The revision's fields, correctness-tagged ones marked, drifted ones noted."""
    tags = field_tags()
    drifted_fields = set(drifted)
    text = Text()
    text.append(f"{view.ref}", style="bold")
    text.append(f" (digest {view.digest[:12]})\n{MARK} correctness: can change the tokens a request gets\n"
                f"{PERFORMANCE_MARK} performance: cannot", style="italic")
    for name, value in view.spec.items():
        if name == ENGINE_ARGS:
            for flag, flag_value in (value or {}).items():
                _field_line(text, f"engine_args.{flag}", flag_value, engine_arg_tag(flag) == CORRECTNESS,
                            f"engine_args.{flag}" in drifted_fields)
            continue
        _field_line(text, name, value, tags.get(name) == CORRECTNESS, name in drifted_fields)
    return text


def _field_line(text: Text, name: str, value: Any, correctness: bool, drifted: bool) -> None:
    text.append(f"\n{MARK if correctness else PERFORMANCE_MARK} ", style="bold" if correctness else "dim")
    text.append(f"{name:<22} {fmt.NONE if value is None else value}", style="yellow" if drifted else "")
    if drifted:
        text.append("  ← drifted", style="bold yellow")


def events_text(events: list[FleetEventView], tz: tzinfo | None = None) -> Text:
    if not events:
        return Text("events: none about it yet")
    text = Text()
    text.append("events (latest first)", style="bold")
    for event in events:
        at = fmt.parse_time(event.at)
        when = fmt.clock_time(at, tz) if at is not None else event.at
        text.append(f"\n{when} {event.severity:<7} {event.message}",
                    style={"alert": "bold", "warning": "italic"}.get(event.severity, ""))
    return text


class EngineScreen(BaseScreen):
    HEADING = "Engine"
    FLEET_ACTIONS = frozenset({"drain", "cordon", "uncordon"})
    BINDINGS: ClassVar[list[BindingType]] = [Binding("d", "drain", "drain"), Binding("c", "cordon", "cordon"),
                                             Binding("u", "uncordon", "uncordon")]

    def __init__(self, key: str) -> None:
        super().__init__(name=None)
        self.key = key
        self.node, _, self.engine_name = key.partition("/")
        self._class_ref: str | None = None
        self._class_error: str | None = None

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="engine-body"):
            yield Static(id="engine-summary")
            for series, label, _format in SPARKS:
                with Horizontal(classes="spark-row"):
                    yield Static(label, id=f"spark-label-{series}", classes="spark-label")
                    yield Sparkline([], id=f"spark-{series}", classes="spark")
            yield Static(id="engine-drift")
            yield Static(id="engine-tiers")
            with Horizontal(id="engine-columns"):
                yield Static(id="engine-class")
                yield Static(id="engine-events")

    def on_mount(self) -> None:
        self.query_one("#engine-body").border_title = f"Engine {self.key}"
        self._fit_width(self.app.size.width)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_width(event.size.width)

    def _fit_width(self, width: int) -> None:
        self.query_one("#engine-columns").set_class(width < NARROW, "-narrow")

    def refresh_from(self, fleet: FleetState, applied: Applied) -> None:
        mine = applied.reset or ("engine", self.key) in applied.changed
        if mine or applied.touches("node"):
            self._show_engine(fleet.get("engine", self.key))
        if applied.reset or any(names_engine(e, self.key, self.engine_name) for e in applied.events):
            self._show_events(fleet)

    def _show_engine(self, engine: WatchEngineView | None) -> None:
        if engine is None:
            self.query_one("#engine-summary", Static).update(
                Text(f"{self.key} is no longer in the fleet (removed, or its node was)", style="bold"))
            return
        at = fmt.parse_time(engine.updated_at)
        age = None if at is None else (self.fleet_app.clock() - at).total_seconds()
        self.query_one("#engine-summary", Static).update(summary(engine, age))
        self._show_sparks()
        self.query_one("#engine-drift", Static).update(drift_text(engine))
        self.query_one("#engine-drift").set_class(bool(engine.drift), "-drifted")
        tiers = tiers_text(self.fleet_app.fleet.get("node", engine.node), engine.class_ref.partition("@")[0])
        panel = self.query_one("#engine-tiers", Static)
        panel.display = tiers is not None
        panel.update(tiers or "")
        if engine.class_ref != self._class_ref:
            self._class_ref = engine.class_ref
            self._show_class()

    def _show_sparks(self) -> None:
        history = self.fleet_app.history
        for series, label, format_value in SPARKS:
            values = known(history.series(self.key, series))
            last = format_value(values[-1]) if values else fmt.NONE
            self.query_one(f"#spark-label-{series}", Static).update(f"{label} {last}")
            # one sample would fill the whole width: a line starts at the second
            self.query_one(f"#spark-{series}", Sparkline).data = values if len(values) > 1 else []

    def _show_events(self, fleet: FleetState) -> None:
        mine = [e for e in reversed(fleet.events) if names_engine(e, self.key, self.engine_name)]
        tz = self.fleet_app.clock().tzinfo
        self.query_one("#engine-events", Static).update(events_text(mine[:EVENTS_SHOWN], tz))

    # --- the class revision ---

    def _show_class(self) -> None:
        ref = self._class_ref
        panel = self.query_one("#engine-class", Static)
        if ref is None:
            return
        view = self.fleet_app.class_revisions.get(ref)
        if view is not None:
            engine = self.fleet_app.fleet.get("engine", self.key)
            panel.update(class_text(view, [d.field for d in engine.drift] if engine else []))
        elif self.fleet_app.client is None:
            panel.update(f"{ref}: its fields need a controller client")
        else:
            panel.update(f"{ref}: loading…")
            self._fetch_class(ref)

    @work(exclusive=True, group="class", exit_on_error=False)
    async def _fetch_class(self, ref: str) -> None:
        client = self.fleet_app.client
        assert client is not None
        try:
            self.post_message(ClassLoaded(ref, await client.get_class(ref)))
        except FleetError as exc:
            self.post_message(ClassLoaded(ref, None, exc.message))

    def on_class_loaded(self, message: ClassLoaded) -> None:
        if message.view is not None:
            self.fleet_app.remember_class(message.view)
            self._show_class()
        elif message.ref == self._class_ref:
            self.query_one("#engine-class", Static).update(f"{message.ref}: could not load it ({message.error})")

    # --- actions ---

    def action_drain(self) -> None:
        self._request(actions.drain_engine)

    def action_cordon(self) -> None:
        self._request(actions.cordon_engine)

    def action_uncordon(self) -> None:
        self._request(actions.uncordon_engine)

    def _request(self, build: Callable[[str, str], actions.Action]) -> None:
        try:
            actions.request_action(self.app, build(self.node, self.engine_name))
        except NotImplementedError:  # a build whose ui.actions is still the interface only
            self.notify("actions are not available in this build", severity="warning")
