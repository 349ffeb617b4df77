"""The screens an operator switches between: `:` + a name or alias, or the number key.

Each entry's factory builds the screen; screens implement `refresh_from(fleet, applied)` (ui/screens/base.py)
and are handed every change while they are shown, and the whole state when they are shown again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.screen import Screen


@dataclass(frozen=True)
class ScreenEntry:
    name: str  # the `:` command and the screen's name in the app
    key: str  # its number key
    title: str
    aliases: tuple[str, ...]
    factory: Callable[[], Screen]


def entries() -> tuple[ScreenEntry, ...]:
    """Every switchable screen, in number order (imported late: the screens import the app's widgets)."""
    from ui.screens.events import EventsScreen
    from ui.screens.fleet import FleetScreen
    from ui.screens.pd import PdScreen
    from ui.screens.quality import QualityScreen
    from ui.screens.rollouts import RolloutsScreen
    from ui.screens.traffic import TrafficScreen

    return (
        ScreenEntry("fleet", "1", "Fleet", ("nodes", "engines", "no", "en", "fl"), FleetScreen),
        ScreenEntry("rollouts", "2", "Rollouts", ("rollout", "ro"), RolloutsScreen),
        ScreenEntry("quality", "3", "Quality", ("canary", "canaries", "qu", "ca"), QualityScreen),
        ScreenEntry("traffic", "4", "Traffic", ("gateways", "gateway", "tr", "gw"), TrafficScreen),
        ScreenEntry("events", "5", "Events", ("event", "audit", "ev"), EventsScreen),
        ScreenEntry("pd", "6", "P:D", ("prefill", "decode", "rebalance", "planner"), PdScreen),
    )


def find(command: str) -> ScreenEntry | None:
    """The entry a `:` command names (its name, an alias or its number), None when none does."""
    wanted = command.strip().lower()
    return next((e for e in entries() if wanted in (e.name, e.key, *e.aliases)), None)
