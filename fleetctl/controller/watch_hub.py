"""The change stream's publisher: one hub per controller process, shared by every viewer of `GET /api/v1/watch`.

While a viewer is connected, a background thread ticks every `watch_tick_s`: it builds every watched
resource in one session (watch_build.py), diffs them against the last tick (watch_diff.py), reads the events
appended since (watch_events.py), and when anything changed appends ONE delta to a ring, serialised once to
its SSE frame. Every viewer writes those same bytes. A viewer's position is its own cursor (a sequence
number) into the ring, so a slow reader blocks neither the tick nor the other viewers: it catches up from
the ring, and when the delta it needs next was dropped (the ring keeps `watch_history_mib`, oldest dropped
first) it gets a fresh snapshot instead. A snapshot is serialised at most once per sequence number.
A viewer that was sent nothing for `watch_ping_s` gets a ping. The thread stops LINGER_S after the last
viewer left; the next viewer's arrival builds afresh first (`prepare`), so it never starts from old state.

Tokens are `EPOCH-SEQ`; the epoch is random per process, so a token from another process (or before a
restart) is unknown here and its viewer gets a snapshot, as does one whose deltas were dropped.

Threads: ticks run under `_tick_lock` (the background thread, or a request's `prepare` in the threadpool);
`_lock` guards the ring, the published state and the viewers, and is held only for memory work. Viewers are
asyncio tasks; the tick wakes them with `loop.call_soon_threadsafe`. Tests drive `tick()` by hand (with
`background` off there is no thread) and read `counters`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any

from starlette.concurrency import run_in_threadpool

from fleetctl.controller import watch_events
from fleetctl.controller.db import Store
from fleetctl.controller.settings import MIB, ControllerSettings
from fleetctl.controller.watch_build import WatchBuilder
from fleetctl.controller.watch_contract import DELTA, PING, SNAPSHOT, WATCH_KINDS
from fleetctl.controller.watch_diff import diff

log = logging.getLogger(__name__)
LINGER_S = 30.0  # the tick thread stops this long after the last viewer left


@dataclass
class WatchCounters:
    """What the hub did since the process started (fleet_controller_watch_* on /metrics)."""

    ticks: int = 0  # builds of the resources
    tick_seconds: float = 0.0  # time spent in them
    tick_errors: int = 0  # builds that failed (the database was unreachable): the state stays as it was
    deltas: int = 0  # deltas appended to the ring
    delta_serialisations: int = 0  # always equal to `deltas`: each is serialised once
    snapshot_serialisations: int = 0  # at most one per sequence number
    snapshots_sent: int = 0  # to viewers: new ones, unknown or too old tokens, and readers that fell behind
    resumes: int = 0  # connections that resumed from a token without a snapshot
    dropped: int = 0  # deltas dropped from the ring to keep it within its size
    pings_sent: int = 0


@dataclass(eq=False)  # hashed by identity: each is one connection
class _Viewer:
    loop: asyncio.AbstractEventLoop
    woken: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.woken.set)
        except RuntimeError:  # its loop is closed: the viewer is gone
            pass


@dataclass(frozen=True)
class _Entry:
    seq: int
    frame: bytes


def encode(event: str, token: str, payload: dict[str, Any]) -> bytes:
    """One SSE event: its id (the resume token), its name and one line of JSON."""
    data = json.dumps(payload, separators=(",", ":"))
    return f"id: {token}\nevent: {event}\ndata: {data}\n\n".encode()


class WatchHub:
    def __init__(self, settings: ControllerSettings, store: Store, clock: Callable[[], datetime],
                 is_leader: Callable[[], bool], timer: Callable[[], float] = time.monotonic,
                 heard_since: datetime | None = None):
        self.settings, self.store, self.clock, self.timer = settings, store, clock, timer
        self.epoch = secrets.token_hex(4)
        self.counters = WatchCounters()
        self.builder = WatchBuilder(settings, is_leader, heard_since)
        self.background = settings.background
        self.max_bytes = int(settings.watch_history_mib * MIB)
        self._tick_lock = threading.Lock()
        self._lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._seq = 0
        self._built = False
        self._last_tick: float | None = None
        self._resources: dict[str, dict[str, Any]] = {kind: {} for kind in WATCH_KINDS}
        self._events: deque[dict[str, Any]] = deque(maxlen=max(settings.watch_events, 1))
        self._cursors = watch_events.EventCursors()
        self._ring: deque[_Entry] = deque()
        self._ring_bytes = 0
        self._snapshot: tuple[int, bytes] | None = None
        self._viewers: set[_Viewer] = set()
        self._last_left = timer()
        self._ticking = False
        self._closed = threading.Event()

    # --- state ---

    @property
    def seq(self) -> int:
        return self._seq

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    @property
    def ticking(self) -> bool:
        """The tick thread runs."""
        return self._ticking

    @property
    def history_bytes(self) -> int:
        return self._ring_bytes

    def token(self, seq: int) -> str:
        return f"{self.epoch}-{seq}"

    def position_of(self, token: str | None) -> int | None:
        """The sequence number a token of this process names; None for another epoch or a malformed one."""
        epoch, _, seq = (token or "").strip().rpartition("-")
        if epoch != self.epoch or not seq.isdigit():
            return None
        return int(seq)

    # --- ticking ---

    def tick(self) -> bool:
        """Build, diff, and append a delta when anything changed (True). The first build only sets the state."""
        with self._tick_lock:
            started = self.timer()
            try:
                changed = self._tick()
            except Exception:
                self.counters.tick_errors += 1
                raise
            finally:
                self.counters.ticks += 1
                self.counters.tick_seconds += self.timer() - started
                self._last_tick = self.timer()
        if changed:
            self._wake_all()
        return changed

    def _tick(self) -> bool:
        now = self.clock()
        with self.store.session() as session:
            built = self.builder.build(session, now)
            if self._built:
                events, cursors = watch_events.since(session, self._cursors)
            else:
                events, cursors = watch_events.latest(session, self.settings.watch_events)
        if not self._built:
            with self._lock:
                self._resources, self._cursors, self._built = built, cursors, True
                self._events.extend(events)
            return False
        published, changes = diff(self._resources, built)
        frame = None
        if changes or events:
            payload = {"token": self.token(self._seq + 1), "at": now.isoformat(), "changes": changes, "events": events}
            frame = encode(DELTA, payload["token"], payload)
            self.counters.delta_serialisations += 1
        with self._lock:
            self._resources, self._cursors = published, cursors
            if frame is not None:
                self._seq += 1
                self._events.extend(events)
                self._append(_Entry(self._seq, frame))
        return frame is not None

    def _append(self, entry: _Entry) -> None:
        """Add to the ring (under `_lock`), dropping the oldest beyond its size (the newest always stays)."""
        self._ring.append(entry)
        self._ring_bytes += len(entry.frame)
        self.counters.deltas += 1
        while len(self._ring) > 1 and self._ring_bytes > self.max_bytes:
            self._ring_bytes -= len(self._ring.popleft().frame)
            self.counters.dropped += 1

    def prepare(self) -> None:
        """Make the state fresh for a new viewer: tick now unless a tick ran within the last `watch_tick_s`
        (the first viewer after a quiet spell sees the fleet as it is, not as it was). Raises what the build
        raised (the database is down) when there is no state at all to serve."""
        last = self._last_tick
        if self._built and last is not None and self.timer() - last < self.settings.watch_tick_s:
            return
        try:
            self.tick()
        except Exception:
            if not self._built:
                raise
            log.exception("building the change stream failed; serving the last state")

    def _tick_loop(self) -> None:
        interval = self.settings.watch_tick_s
        while True:
            started = self.timer()
            with self._lock:
                if self._closed.is_set() or (not self._viewers and started - self._last_left > LINGER_S):
                    self._ticking = False
                    return
            try:
                self.tick()
            except Exception:
                log.exception("building the change stream failed; trying again at the next tick")
            if self._closed.wait(max(interval - (self.timer() - started), 0.0)):
                with self._lock:
                    self._ticking = False
                return

    def close(self) -> None:
        """End every viewer's stream (the server is shutting down) and stop ticking."""
        self._closed.set()
        self._wake_all()

    # --- viewers ---

    async def stream(self, resume: str | None) -> AsyncIterator[bytes]:
        """One viewer's SSE bytes: a snapshot (or, resuming, the deltas it missed), then each delta, or a
        ping after `watch_ping_s` of silence, until the client leaves or the hub closes."""
        viewer = self._join()
        try:
            position, first = await run_in_threadpool(self._start, resume)
            if first:
                yield first
            while not self._closed.is_set():
                viewer.woken.clear()  # before looking: a delta appended after the look wakes the wait below
                pending = self._after(position)
                if pending is None:  # what it needs next was dropped: start it over
                    position, frame = await run_in_threadpool(self._snapshot_frame)
                    yield frame
                elif pending:
                    position = pending[-1].seq
                    yield b"".join(entry.frame for entry in pending)
                elif not await _wait(viewer.woken, self.settings.watch_ping_s):
                    self.counters.pings_sent += 1
                    yield encode(PING, self.token(position), {"token": self.token(position), "at": self.clock().isoformat()})
        finally:
            self._leave(viewer)

    def _join(self) -> _Viewer:
        viewer = _Viewer(asyncio.get_running_loop())
        with self._lock:
            self._viewers.add(viewer)
            if self.background and not self._ticking and not self._closed.is_set():
                self._ticking = True
                threading.Thread(target=self._tick_loop, name="fleetctl-watch", daemon=True).start()
        return viewer

    def _leave(self, viewer: _Viewer) -> None:
        with self._lock:
            self._viewers.discard(viewer)
            self._last_left = self.timer()

    def _start(self, resume: str | None) -> tuple[int, bytes]:
        """(position, first bytes) of a new connection: the missed deltas when `resume` can be replayed from
        the ring (possibly none), else a snapshot."""
        self.prepare()
        asked = self.position_of(resume)
        if asked is not None:
            with self._lock:
                pending = self._after_locked(asked)
            if pending is not None:
                self.counters.resumes += 1
                return (pending[-1].seq if pending else asked), b"".join(entry.frame for entry in pending)
        return self._snapshot_frame()

    def _after(self, position: int) -> list[_Entry] | None:
        with self._lock:
            return self._after_locked(position)

    def _after_locked(self, position: int) -> list[_Entry] | None:
        """The ring's deltas after `position`; [] when there are none yet; None when `position` is not one
        the ring can continue from (dropped already, or never reached in this epoch)."""
        if position == self._seq:
            return []
        if position > self._seq or not self._ring or position + 1 < self._ring[0].seq:
            return None
        return list(islice(self._ring, position + 1 - self._ring[0].seq, None))

    def _snapshot_frame(self) -> tuple[int, bytes]:
        """(seq, the snapshot at seq), serialised once per seq."""
        with self._snapshot_lock:
            with self._lock:
                seq, resources, events = self._seq, self._resources, list(self._events)
            cached = self._snapshot
            if cached is None or cached[0] != seq:
                payload = {"token": self.token(seq), "at": self.clock().isoformat(), "ping_s": self.settings.watch_ping_s,
                           "resources": resources, "events": events[-self.settings.watch_events:] if self.settings.watch_events else []}
                cached = self._snapshot = (seq, encode(SNAPSHOT, payload["token"], payload))
                self.counters.snapshot_serialisations += 1
            self.counters.snapshots_sent += 1
            return cached

    def _wake_all(self) -> None:
        with self._lock:
            viewers = list(self._viewers)
        for viewer in viewers:
            viewer.wake()


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether `event` was set within `timeout_s`."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
        return True
    except asyncio.TimeoutError:
        return False
