"""How the TUI writes numbers: compact, fixed-width-friendly, and "—" for a figure that is not known.

Pure functions, shared by the header, the fleet table and the detail screens:

    rate(12345.6) -> "12.3k"     seconds(0.0423) -> "42ms"     percent(0.623) -> "62%"
    age(75.0) -> "1m15s"         bar(0.62, 10) -> "━━━━━━────"  clock_time(at) -> "14:03:07"
"""

from __future__ import annotations

import math
from datetime import datetime, tzinfo

NONE = "—"  # a figure that is not known (not measured yet, or not reported)


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def rate(value: float | None) -> str:
    """A per-second rate in 3-4 characters: 0, 0.4, 12.3, 456, 12.3k, 4.5M."""
    if not _known(value):
        return NONE
    assert value is not None
    magnitude = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.1f}{suffix}" if magnitude < 100 * limit else f"{value / limit:.0f}{suffix}"
    if magnitude == 0:
        return "0"
    return f"{value:.1f}" if magnitude < 100 else f"{value:.0f}"


def seconds(value: float | None) -> str:
    """A latency: 850µs, 42ms, 1.25s, 12.5s, 3m05s."""
    if not _known(value):
        return NONE
    assert value is not None
    if value < 0.001:
        return f"{value * 1e6:.0f}µs"
    if value < 1:
        return f"{value * 1e3:.0f}ms"
    if value < 10:
        return f"{value:.2f}s"
    if value < 60:
        return f"{value:.1f}s"
    return age(value)


def age(value: float | None) -> str:
    """A duration in whole units: 4.2s, 1m15s, 2h03m, 3d04h."""
    if not _known(value):
        return NONE
    assert value is not None
    if value < 10:
        return f"{value:.1f}s"
    whole = int(value)
    if whole < 60:
        return f"{whole}s"
    return whole_units(whole)


def whole_units(whole: int) -> str:
    """Whole seconds in their two largest units: 45s, 2m03s, 1h05m, 3d02h."""
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def percent(fraction: float | None) -> str:
    """A fraction 0..1 as a whole percentage."""
    if not _known(fraction):
        return NONE
    assert fraction is not None
    return f"{100 * fraction:.0f}%"


def count(value: int | float | None) -> str:
    if value is None:
        return NONE
    return str(int(value)) if value < 10_000 else rate(float(value))


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar `width` cells wide, filled to `fraction` (0..1); blank when unknown."""
    if not _known(fraction) or width <= 0:
        return " " * max(width, 0)
    assert fraction is not None
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return "━" * filled + "─" * (width - filled)


def clock_time(at: datetime, tz: tzinfo | None = None) -> str:
    """HH:MM:SS of `at` in `tz` (the app clock's zone)."""
    return (at.astimezone(tz) if tz is not None and at.tzinfo is not None else at).strftime("%H:%M:%S")


def parse_time(text: str | None) -> datetime | None:
    """An ISO timestamp from the API, None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
