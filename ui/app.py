"""The TUI application: a live view of the fleet from the controller's change stream, k9s style.

`make_app()` builds it, for `fleetctl tui` and for the tests alike:

    app = make_app("http://127.0.0.1:8080", token)                   # the real stream (follow())
    app = make_app(source=scripted, clock=fixed_clock)               # a test: any async iterable

How data flows ("attributes down, messages up"):
- A worker (`_follow`) reads the source (WatchMessage | Disconnected, reconnecting by itself) and puts
  each item in the inbox (ui/feed.py), waking the app with `StreamArrived` when the inbox was empty. It
  never touches the state or a widget.
- The app, on the UI side, takes the whole inbox, applies it in order to `fleet` (a FleetState), and posts
  one `FleetChanged` for the batch (and a `ConnectionChanged` when the connection came or went). A burst
  that arrived while the screen was busy costs one refresh.
- Each message applied is sampled into the engines' history; on FleetChanged the app hands the visible
  screen `refresh_from(fleet, applied)`; a screen shown again gets `Applied(reset=True)` (ui/screens/base.py).

Public attributes the screens use: `fleet`, `history`, `client` (AsyncControllerClient, None in tests
that need none), `readonly` and `readonly_reason` ("--readonly", or "viewer token" once `whoami` says the
token's role is viewer), `stale_since` (None while connected), `clock()`; and the navigation:
`show_screen(name)`, `open_engine(key)`, `go_back()`, `show_help()`.
"""

from __future__ import annotations

import gc
from collections import OrderedDict, deque
from collections.abc import AsyncIterable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.worker import Worker, WorkerState

from fleetctl.client import DEFAULT_CONTROLLER, AsyncControllerClient
from fleetctl.controller.responses import ClassRevisionView
from fleetctl.errors import FleetError
from fleetctl.watch_state import Applied, FleetState
from ui import registry
from ui.feed import Batch, Inbox, apply_batch
from ui.history import EngineHistory
from ui.messages import ConnectionChanged, FleetChanged
from ui.screens.base import BaseScreen, screen_keys
from ui.screens.engine import EngineScreen
from ui.widgets.header import PulseState
from ui.widgets.help import HelpScreen

BACK_STEPS = 20  # esc remembers this many screens
COUNTDOWN_S = 1.0  # how often a stale header's "retry in Ns" is redrawn
CLASSES_CACHED = 64  # class revisions are immutable: fetched once each, the latest 64 kept
VIEWER_ROLE = "viewer"


def local_now() -> datetime:
    return datetime.now().astimezone()


class StreamArrived(Message):
    """The inbox was empty and is not any more."""


class RoleLearned(Message):
    def __init__(self, role: str | None) -> None:
        super().__init__()
        self.role = role


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection inside the block (what it allocates is counted, and collected after it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class FleetApp(App[None]):
    CSS_PATH = "fleet.tcss"
    TITLE = "fleetctl"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("ctrl+c", "quit", "quit", show=False, priority=True)]

    def __init__(self, *, controller_url: str, client: AsyncControllerClient | None,
                 source: AsyncIterable[Any] | None, readonly: bool, owns_client: bool,
                 clock: Callable[[], datetime]) -> None:
        super().__init__()
        self.controller_url = controller_url
        self.client = client
        self.readonly = readonly
        self.readonly_reason: str | None = "--readonly" if readonly else None
        self.fleet = FleetState()
        self.history = EngineHistory()
        self.stale_since: datetime | None = None
        self.connection_error: str | None = None
        self.retry_at: datetime | None = None  # when the stream tries again (the header counts down to it)
        self.clock = clock
        self.class_revisions: OrderedDict[str, ClassRevisionView] = OrderedDict()
        self._source = source
        self._owns_client = owns_client
        self.inbox = Inbox()
        self._back: deque[str] = deque(maxlen=BACK_STEPS)
        self._names: dict[int, str] = {}  # id(installed screen) -> its registry name

    # --- start and stop ---

    def on_mount(self) -> None:
        for entry in registry.entries():
            screen = entry.factory()
            self.install_screen(screen, entry.name)
            self._names[id(screen)] = entry.name
        self.push_screen("fleet")
        self.set_interval(COUNTDOWN_S, self.tick_countdown)
        self._follow()
        if self.client is not None and not self.readonly:
            self._learn_role()

    async def on_unmount(self) -> None:
        gc.unfreeze()  # the process may live on (tests, an embedding app): the collector as it was
        if self._owns_client and self.client is not None:
            await self.client.aclose()

    def _stream(self) -> AsyncIterable[Any]:
        if self._source is not None:
            return self._source
        from fleetctl.watch_client import follow  # the real stream, reconnecting by itself

        assert self.client is not None
        return follow(self.client)

    # --- the stream (a worker puts, the UI side applies) ---

    @work(exclusive=True, group="stream", exit_on_error=False)
    async def _follow(self) -> None:
        async for item in self._stream():
            if self.inbox.put(item):
                self.post_message(StreamArrived())

    def on_stream_arrived(self, _message: StreamArrived) -> None:
        batch = self.take_inbox()
        if batch.connection is not None:
            self.post_message(batch.connection)
        if batch.applied is not None:
            self.post_message(FleetChanged(batch.applied))

    def take_inbox(self) -> Batch:
        """Apply everything waiting in the inbox. The collector waits until the messages are applied and
        dropped: a collection in the middle would walk every change of a 4,000-engine delta (20-30 ms), one
        after it walks only what the fleet keeps."""
        with _collector_paused():
            return self.apply_items(self.inbox.take())

    def apply_items(self, items: list[Any]) -> Batch:
        """Apply stream items (in order) to `fleet`, sampling the history; the connection follows."""
        batch = apply_batch(self.fleet, items, self.stale_since, self._sample)
        if batch.applied is not None and batch.applied.reset:
            # A snapshot's values live long: keep them out of the collector's full passes, which would
            # otherwise walk the whole fleet (pauses of tens of ms on a 4,000-engine fleet). What the last
            # freeze kept and has died since is collected first, so memory stays bounded across reconnects.
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        self.stale_since = batch.stale_since
        return batch

    def _sample(self, applied: Applied) -> None:
        self.history.record(self.fleet, applied)

    def on_fleet_changed(self, message: FleetChanged) -> None:
        applied = message.applied
        screen = self.receiver()
        if screen is None:
            return
        with _collector_paused():  # the refresh builds rows and lines, no reference cycle
            screen.refresh_from(self.fleet, applied)
        if applied.touches("pulse") or applied.touches("controller"):
            screen.refresh_chrome()

    def on_connection_changed(self, message: ConnectionChanged) -> None:
        self.connection_error = message.error
        self.retry_at = None if message.retry_in_s is None else self.clock() + timedelta(seconds=message.retry_in_s)
        self._refresh_chrome()

    def tick_countdown(self) -> None:
        """While stale and waiting to retry, the header's "retry in Ns" counts down."""
        if self.stale_since is not None and self.retry_at is not None:
            self._refresh_chrome()

    @property
    def retry_in_s(self) -> float | None:
        """Seconds until the stream tries again (0 once due); None when connected or not retrying."""
        if self.retry_at is None:
            return None
        return max(0.0, (self.retry_at - self.clock()).total_seconds())

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The stream's worker failed (not a disconnect, which follow() retries): say so, as stale."""
        if event.worker.group == "stream" and event.state is WorkerState.ERROR:
            self.stale_since = self.stale_since or self.clock()
            self.connection_error = f"the change stream stopped: {event.worker.error}"
            self.retry_at = None
            self._refresh_chrome()

    def receiver(self) -> BaseScreen | None:
        """The screen shown: the top one, or the one under a modal (help, a confirmation)."""
        for screen in reversed(self.screen_stack):
            if isinstance(screen, BaseScreen):
                return screen
            if not isinstance(screen, ModalScreen):
                return None
        return None

    def pulse_state(self) -> PulseState:
        return PulseState(pulse=self.fleet.pulse(), controller=self.fleet.controller(), stale_since=self.stale_since,
                          error=self.connection_error, retry_in_s=self.retry_in_s, tz=self.clock().tzinfo,
                          target=self.controller_url)

    def _refresh_chrome(self) -> None:
        screen = self.receiver()
        if screen is not None:
            screen.refresh_chrome()

    # --- read-only from the token's role ---

    @work(exclusive=True, group="whoami", exit_on_error=False)
    async def _learn_role(self) -> None:
        assert self.client is not None
        try:
            me = await self.client.whoami()
        except FleetError as exc:
            self.log.warning(f"whoami: {exc}")
            return
        role = me.get("role") if isinstance(me, dict) else getattr(me, "role", None)
        self.post_message(RoleLearned(role))

    def on_role_learned(self, message: RoleLearned) -> None:
        if message.role == VIEWER_ROLE and not self.readonly:
            self.readonly, self.readonly_reason = True, "viewer token"
            self._refresh_chrome()

    # --- class revisions (fetched by the engine detail, kept here) ---

    def remember_class(self, view: ClassRevisionView) -> None:
        self.class_revisions[view.ref] = view
        self.class_revisions.move_to_end(view.ref)
        while len(self.class_revisions) > CLASSES_CACHED:
            self.class_revisions.popitem(last=False)

    # --- navigation ---

    def show_screen(self, name: str, filter_text: str | None = None) -> None:
        """Switch to the registry's screen `name` (leaving any detail), optionally with a filter."""
        while self._is_detail(self.screen):
            self.pop_screen()
        target = self.get_screen(name)
        if filter_text is not None and isinstance(target, BaseScreen):
            target.set_filter(filter_text)
        current = self.screen_stack[-1]
        if current is target:
            return
        current_name = self.screen_name(current)
        if current_name is not None:
            self._back.append(current_name)
        self.switch_screen(name)

    def open_engine(self, key: str) -> None:
        if self.fleet.resources.get("engine", {}).get(key) is not None:
            self.push_screen(EngineScreen(key))

    def go_back(self) -> None:
        """esc: leave a detail, else return to the screen shown before this one."""
        if self._is_detail(self.screen):
            self.pop_screen()
            return
        while self._back:
            name = self._back.pop()
            if name != self.screen_name():
                self.switch_screen(name)
                return

    def screen_name(self, screen: Screen | None = None) -> str | None:
        """The registry name of `screen` (default: the current one); None for a detail or a modal."""
        return self._names.get(id(self.screen if screen is None else screen))

    def _is_detail(self, screen: Screen) -> bool:
        return isinstance(screen, BaseScreen) and self.screen_name(screen) is None

    def show_help(self) -> None:
        hidden = set()
        shared = {key for key, _ in screen_keys(BaseScreen)}
        sections = [("Everywhere", [*screen_keys(BaseScreen), (f"1-{len(registry.entries())}", "the screens, in order below"),
                                    (":q", "quit too (and ctrl+c)")])]
        for entry in registry.entries():
            factory: Any = entry.factory
            if self.readonly:
                hidden = set(getattr(factory, "FLEET_ACTIONS", ()))
            keys = [(key, what) for key, what in screen_keys(factory, hidden) if key not in shared]
            keys += list(getattr(factory, "HELP_EXTRA", ()))
            aliases = ", ".join((entry.name, *entry.aliases))
            sections.append((f"{entry.key} {entry.title} (:{aliases})", keys))
        sections.append(("Engine detail (enter on the Fleet screen)",
                         [(key, what) for key, what in screen_keys(EngineScreen) if key not in shared]))
        notes = [f"read-only ({self.readonly_reason}): the keys that change the fleet are off"] if self.readonly else []
        self.push_screen(HelpScreen(sections, notes))


def make_app(controller_url: str = DEFAULT_CONTROLLER, token: str | None = None, readonly: bool = False, *,
             source: AsyncIterable[Any] | None = None, client: AsyncControllerClient | None = None,
             clock: Callable[[], datetime] | None = None) -> FleetApp:
    """The TUI. `source`: any async iterable of WatchMessage | Disconnected (default: follow() of a client of
    `controller_url`); `client`: for whoami, class revisions and actions (default: one of `controller_url`
    with `token`, unless a `source` is given); `clock`: "now" (default: the local time)."""
    owns_client = client is None and source is None
    if owns_client:
        client = AsyncControllerClient(controller_url, token)
    return FleetApp(controller_url=controller_url, client=client, source=source, readonly=readonly,
                    owns_client=owns_client, clock=clock or local_now)
