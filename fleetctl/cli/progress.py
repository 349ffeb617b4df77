"""Waiting for drains: poll engine states until every drained engine has stopped (or is gone)."""

from __future__ import annotations

import time
from collections.abc import Callable
from fleetctl.cli.output import status
from fleetctl.controller.responses import EngineView
from fleetctl.errors import FleetError

DONE_STATES = frozenset({"stopped", "failed"})


def pending(engines: list[EngineView]) -> list[EngineView]:
    """Engines that were told to drain and have not stopped yet."""
    return [e for e in engines if e.drain and e.state not in DONE_STATES]


def summary(engines: list[EngineView]) -> str:
    counts: dict[str, int] = {}
    for engine in engines:
        counts[engine.state] = counts.get(engine.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none left"


def wait_drained(what: str, fetch: Callable[[], list[EngineView]], timeout_s: float, poll_s: float = 1.0) -> None:
    """Poll `fetch` (the drained engines' current views) until none is pending; report changes on stderr.
    Raises FleetError (code drain_timeout) when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        engines = [e for e in fetch() if e.drain]
        line = f"{what}: {summary(engines)}"
        if line != last:
            status(line)
            last = line
        left = pending(engines)
        if not left:
            status(f"{what}: drained")
            return
        if time.monotonic() >= deadline:
            names = ", ".join(sorted(e.name for e in left))
            raise FleetError(f"{what}: not drained after {timeout_s:g}s; still running: {names}", code="drain_timeout")
        time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.05)))
