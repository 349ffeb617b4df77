"""From the change stream to the screen: the inbox between the stream's worker and the UI, and what one
batch of stream items does to the app's FleetState and connection.

The worker puts every item (a WatchMessage, or a Disconnected from fleetctl/watch_client.py) in the Inbox in
the order it came and wakes the app only when the inbox was empty. The app takes everything waiting and
applies it in order (`apply_batch`), so a burst that arrived while the screen was busy costs one refresh,
and a disconnect is never reordered against the messages around it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetctl.controller.watch_contract import WatchDelta, WatchPing, WatchSnapshot
from fleetctl.watch_state import EVENTS_KEPT, Applied, FleetState
from ui.messages import ConnectionChanged

WATCH_MESSAGES = (WatchSnapshot, WatchDelta, WatchPing)


class Inbox:
    """Stream items waiting for the UI, oldest first. Bounded by how fast the UI drains it: the app takes
    the whole inbox each time it is woken."""

    def __init__(self) -> None:
        self._items: list[Any] = []

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Any) -> bool:
        """Queue `item`; True when the inbox was empty (the app must be woken)."""
        self._items.append(item)
        return len(self._items) == 1

    def take(self) -> list[Any]:
        items, self._items = self._items, []
        return items


def merge(first: Applied, second: Applied) -> Applied:
    """One Applied covering both, in order."""
    events = (first.events + second.events)[-EVENTS_KEPT:]
    return Applied(reset=first.reset or second.reset, changed=first.changed | second.changed, events=events,
                   patched=_merge_patched(first, second))


def _merge_patched(first: Applied, second: Applied) -> dict[tuple[str, str], frozenset[str]]:
    """A resource stays "patched only" when each message that changed it patched it; its fields add up."""
    merged = {}
    for pair in first.changed | second.changed:
        fields: frozenset[str] = frozenset()
        for applied in (first, second):
            if pair in applied.changed:
                patch = applied.patched.get(pair)
                if patch is None:
                    break
                fields |= patch
        else:
            merged[pair] = fields
    return merged


def has_changes(applied: Applied) -> bool:
    return applied.reset or bool(applied.changed) or bool(applied.events)


@dataclass(frozen=True)
class Batch:
    applied: Applied | None  # what the batch changed (merged); None: only pings or disconnects
    stale_since: datetime | None  # the connection after the batch: None connected, else cut off since then
    connection: ConnectionChanged | None  # to post: the connection changed, or a disconnect says more


def apply_batch(fleet: FleetState, items: list[Any], stale_since: datetime | None,
                each: Callable[[Applied], None] | None = None) -> Batch:
    """Apply `items` (in order) to `fleet`. `stale_since` is the connection before the batch; `each` is
    called after every message with what it changed (the engine history samples each one)."""
    applied: Applied | None = None
    was_stale = stale_since
    last_disconnect: Any = None
    for item in items:
        if isinstance(item, WATCH_MESSAGES):
            stale_since, last_disconnect = None, None
            result = fleet.apply(item)
            if each is not None:
                each(result)
            applied = result if applied is None else merge(applied, result)
        else:  # a Disconnected: (error, at, retry_in_s); the stale period starts at the first one
            stale_since = stale_since or item.at
            last_disconnect = item
    if applied is not None and not has_changes(applied):
        applied = None
    return Batch(applied, stale_since, _connection(was_stale, stale_since, last_disconnect))


def _connection(before: datetime | None, after: datetime | None, disconnect: Any) -> ConnectionChanged | None:
    if after is None:
        return ConnectionChanged(connected=True) if before is not None else None
    if disconnect is None:
        return None
    return ConnectionChanged(connected=False, stale_since=after, error=disconnect.error,
                             retry_in_s=disconnect.retry_in_s)
