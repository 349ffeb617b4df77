"""Times and durations for the screens, and countdowns. The change stream refreshes a countdown the
controller computed ("seconds left when I built this": a rollout's `pause_left_s`, a drill's
`remaining_s`) only when something else of the value changes, so the screens count down to the
timestamps instead (`pause_ends_at`, `ends_at`) with the app's clock; `Countdowns` counts a bare
"seconds left" down from when it was seen, for a controller that sends no timestamp."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone, tzinfo

from ui.format import NONE, whole_units


def duration(seconds: float | None) -> str:
    """45s, 2m03s, 1h05m, 3d02h; NONE for None."""
    if seconds is None:
        return NONE
    return whole_units(max(0, int(seconds + 0.5)) if seconds < 60 else max(0, int(seconds)))


def parse_at(text: str | None) -> datetime | None:
    """An API timestamp (ISO 8601) as an aware datetime; None when absent or unreadable."""
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)


def clock_time(text: str | None, tz: tzinfo | None = None) -> str:
    """HH:MM:SS of an API timestamp in `tz` (the app clock's zone; UTC when None); NONE when unreadable."""
    at = parse_at(text)
    return at.astimezone(tz or timezone.utc).strftime("%H:%M:%S") if at else NONE


def age(text: str | None, now: datetime) -> str:
    """How long ago an API timestamp was, as a duration ("3m05s"); NONE when unreadable."""
    at = parse_at(text)
    return duration((now - at).total_seconds()) if at else NONE


def seconds_until(text: str | None, now: datetime) -> float | None:
    """Seconds from `now` to an API timestamp, never below 0; None when unreadable."""
    at = parse_at(text)
    return None if at is None else max(0.0, (at - now).total_seconds())


class Countdowns:
    """Seconds left, per key, counted down from when each value was last seen to change.

    `observe(key, left_s, now)` records a value the controller sent; an unchanged value keeps the time it
    was first seen (a snapshot that repeats an old value does not restart its countdown). `left(key, now)`
    is that value less the time since, never below 0."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, datetime]] = {}

    def observe(self, key: str, left_s: float | None, now: datetime) -> None:
        if left_s is None:
            self._seen.pop(key, None)
        elif key not in self._seen or self._seen[key][0] != left_s:
            self._seen[key] = (left_s, now)

    def left(self, key: str, now: datetime) -> float | None:
        seen = self._seen.get(key)
        if seen is None:
            return None
        value, at = seen
        return max(0.0, value - (now - at).total_seconds())

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget the keys no longer shown (bounded memory)."""
        wanted = set(keys)
        for key in [k for k in self._seen if k not in wanted]:
            del self._seen[key]
