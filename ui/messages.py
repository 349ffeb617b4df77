"""Messages the app posts to its screens and widgets ("attributes down, messages up": workers post these
back to the app; the app hands state down)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from textual.message import Message

from fleetctl.watch_state import Applied


@dataclass
class FleetChanged(Message):
    """A watch message was applied to the app's FleetState (`app.fleet`)."""

    applied: Applied


@dataclass
class ConnectionChanged(Message):
    """The change stream connected (stale_since None) or was cut off (stale since then; retrying)."""

    connected: bool
    stale_since: datetime | None = None
    error: str | None = None
    retry_in_s: float | None = None


@dataclass
class ActionDone(Message):
    """An action ran: ok, or refused/failed with the one-line error."""

    title: str
    ok: bool
    detail: str
